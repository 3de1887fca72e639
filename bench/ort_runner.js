#!/usr/bin/env node
// ONNX Runtime (onnxruntime-node, CPU) latency runner for bench/run.sh.
// usage: node ort_runner.js MODEL.onnx --threads N --warmup N --iterations N [--shapes NAME:1x3x224x224,...]
//          [--profile PREFIX] [--no-spin]
// Random inputs (floats in [-1, 1), integers in [0, 10)); prints one JSON line with the median latency
// and every measured iteration's time (times_ms). --profile: ONNX Runtime's own per-node profile, a
// Chrome trace written to PREFIX_<date>.json (its path in the JSON line, "profile"). ONNX Runtime profiles from the session's creation: the trace holds the
// warm-up runs too (its model_run events tell the runs apart).
// Outputs instead (bench/fmnist): --inputs NAME=FILE.npy (float32, C order) --batch B --save-outputs FILE.npy
// runs the model on FILE's rows B at a time and saves its first output's rows stacked (float32).
'use strict';
const fs = require('fs');
const ort = require('onnxruntime-node');

function readNpy(path) {
  const b = fs.readFileSync(path);
  const v1 = b[6] === 1;  // format version: 1 has a 2-byte header length, 2 and 3 a 4-byte one
  const hlen = v1 ? b.readUInt16LE(8) : b.readUInt32LE(8);
  const start = (v1 ? 10 : 12) + hlen;
  const header = b.toString('latin1', v1 ? 10 : 12, start);
  if (!header.includes("'<f4'") || header.includes("'fortran_order': True"))
    throw new Error(`${path}: only float32 C-order .npy inputs`);
  const dims = header.match(/'shape': \(([^)]*)\)/)[1].split(',').filter((d) => d.trim()).map(Number);
  const data = new Float32Array(b.buffer.slice(b.byteOffset + start, b.byteOffset + b.length));
  return { dims, data };
}

function writeNpy(path, dims, data) {
  let header = `{'descr': '<f4', 'fortran_order': False, 'shape': (${dims.join(', ')}${dims.length === 1 ? ',' : ''}), }`;
  while ((10 + header.length + 1) % 64) header += ' ';
  header += '\n';
  const pre = Buffer.alloc(10);
  pre.write('\x93NUMPY', 0, 'latin1');
  pre[6] = 1, pre[7] = 0;
  pre.writeUInt16LE(header.length, 8);
  fs.writeFileSync(path, Buffer.concat([pre, Buffer.from(header, 'latin1'), Buffer.from(data.buffer, data.byteOffset, data.byteLength)]));
}

async function saveOutputs(session, o) {
  const [name, file] = o.inputs.split('=');
  const x = readNpy(file);
  const n = x.dims[0], row = x.data.length / n, parts = [];
  let outDims = null;
  for (let b = 0; b < n; b += o.batch) {
    const e = Math.min(n, b + o.batch);
    const t = new ort.Tensor('float32', x.data.subarray(b * row, e * row), [e - b, ...x.dims.slice(1)]);
    const r = await session.run({ [name]: t });
    const y = r[session.outputNames[0]];
    outDims = y.dims;
    parts.push(Float32Array.from(y.data));
  }
  const total = parts.reduce((a, p) => a + p.length, 0), all = new Float32Array(total);
  let off = 0;
  for (const p of parts) all.set(p, off), off += p.length;
  writeNpy(o.saveOutputs, [n, ...outDims.slice(1)], all);
  console.log(JSON.stringify({ runtime: 'onnxruntime-node', rows: n, output: session.outputNames[0], file: o.saveOutputs }));
}

function parseArgs(argv) {
  const o = { model: null, threads: 1, warmup: 3, iterations: 10, shapes: {}, batch: 256 };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    if (a === '--threads') o.threads = parseInt(argv[++i], 10);
    else if (a === '--warmup') o.warmup = parseInt(argv[++i], 10);
    else if (a === '--iterations') o.iterations = parseInt(argv[++i], 10);
    else if (a === '--inputs') o.inputs = argv[++i];
    else if (a === '--batch') o.batch = parseInt(argv[++i], 10);
    else if (a === '--save-outputs') o.saveOutputs = argv[++i];
    else if (a === '--profile') o.profile = argv[++i];
    else if (a === '--no-spin') o.noSpin = true;
    else if (a === '--shapes') {
      for (const item of argv[++i].split(',')) {
        const c = item.lastIndexOf(':');
        o.shapes[item.slice(0, c)] = item.slice(c + 1).split('x').map(Number);
      }
    } else o.model = a;
  }
  if (!o.model) throw new Error('usage: ort_runner.js MODEL.onnx [--threads N] [--warmup N] [--iterations N] [--shapes ...]');
  return o;
}

function randomTensor(type, dims) {
  const n = dims.reduce((a, b) => a * b, 1);
  if (type === 'float32') {
    const d = new Float32Array(n);
    for (let i = 0; i < n; ++i) d[i] = Math.random() * 2 - 1;
    return new ort.Tensor('float32', d, dims);
  }
  if (type === 'int64') {
    const d = new BigInt64Array(n);
    for (let i = 0; i < n; ++i) d[i] = BigInt(Math.floor(Math.random() * 10));
    return new ort.Tensor('int64', d, dims);
  }
  if (type === 'int32') {
    const d = new Int32Array(n);
    for (let i = 0; i < n; ++i) d[i] = Math.floor(Math.random() * 10);
    return new ort.Tensor('int32', d, dims);
  }
  throw new Error(`unsupported input type ${type}`);
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const session = await ort.InferenceSession.create(o.model, {
    executionProviders: ['cpu'],
    graphOptimizationLevel: 'all',
    intraOpNumThreads: o.threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
    ...(o.profile ? { enableProfiling: true, profileFilePrefix: o.profile } : {}),
    // --no-spin: idle intra-op workers sleep instead of spinning (kiln's peer: OMP_WAIT_POLICY=passive)
    ...(o.noSpin ? { extra: { session: { intra_op: { allow_spinning: '0' } } } } : {}),
  });
  if (o.saveOutputs) return saveOutputs(session, o);
  const feeds = {};
  const meta = session.inputMetadata || [];
  session.inputNames.forEach((name, idx) => {
    const m = Array.isArray(meta) ? meta[idx] : meta[name];
    const type = (m && m.type) || 'float32';
    let dims = o.shapes[name];
    if (!dims) {
      if (!m || !m.shape) throw new Error(`give the shape of input '${name}' with --shapes`);
      dims = m.shape.map((d) => (typeof d === 'number' && d > 0 ? d : 1));
    }
    feeds[name] = randomTensor(type, dims);
  });
  for (let i = 0; i < o.warmup; ++i) await session.run(feeds);
  const times = [];
  for (let i = 0; i < o.iterations; ++i) {
    const t0 = process.hrtime.bigint();
    await session.run(feeds);
    times.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  let profile;
  if (o.profile) {  // onnxruntime-node's endProfiling returns no path: the newest PREFIX_*.json
    session.endProfiling();
    const path = require('path'), dir = path.dirname(o.profile), base = path.basename(o.profile) + '_';
    const hits = fs.readdirSync(dir).filter((f) => f.startsWith(base) && f.endsWith('.json'))
      .map((f) => path.join(dir, f)).sort((a, b) => fs.statSync(b).mtimeMs - fs.statSync(a).mtimeMs);
    profile = hits[0];
  }
  const s = [...times].sort((a, b) => a - b);
  const n = s.length;
  const median = n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
  console.log(JSON.stringify({
    runtime: 'onnxruntime-node', version: require('onnxruntime-node/package.json').version,
    threads: o.threads, iterations: n, median_ms: median, min_ms: s[0], max_ms: s[n - 1],
    mean_ms: times.reduce((a, b) => a + b, 0) / n, times_ms: times, ...(profile ? { profile } : {}),
  }));
}

main().catch((e) => { console.error(`ort_runner: ${e.message}`); process.exit(1); });
