// The tactic registry: every backend's tactic list in one place, in priority order (the auto-tuner,
// src/tune, times the candidates; the order breaks ties). A backend contributes its list through
// one entry of the table in registry.cc (the CPU's is backends/cpu/tactic_list.cc; a CUDA backend
// adds its own entry), so the engine, the tuner, the tests and the benchmarks see one registry.
//
// A tactic is a candidate for a layer when it implements the layer's op on the layer's device, its
// TacticInfo fits the signature (precision, the dtype of the first input and output) and the target
// (instruction set), and why_unsupported() accepts the signature. The first failing check is the
// reason it is declined.
#pragma once

#include <string>
#include <vector>

#include "backends/tactic.h"

namespace kiln::backends {

// Every tactic of every backend compiled in, in priority order.
const std::vector<const Tactic*>& all_tactics();
const Tactic* find_tactic(const std::string& name);
// Appends a tactic registered at run time (a custom op's kernel, src/plugin) after the built-in ones.
// Not thread-safe against concurrent lookups: plugins load before engines build or run.
void add_tactic(const Tactic* t);
// The kernel libraries behind the tactics, with their run-time versions ("oneDNN 2.6.3"; "" with
// none): part of the timing cache's identity, since a library upgrade changes the kernels' speed.
std::string tactic_libraries();

// Whether `t` implements the layer's (domain, op) on the layer's device kind.
bool implements(const Tactic& t, const LayerSignature& sig);
// Why `info` does not fit `sig`, e.g. "needs avx512_bf16; the target has avx2", "computes in
// float16; the layer computes in float32", "takes float32 input 0; the layer's is int8"; "" when it fits.
std::string info_mismatch(const TacticInfo& info, const LayerSignature& sig);
// Why a tactic implementing the layer's op declines it: info_mismatch, else why_unsupported ("" : it
// supports the layer).
std::string why_declined(const Tactic& t, const LayerSignature& sig);
// The tactics implementing this layer's op on its device and supporting its signature, in priority order.
std::vector<const Tactic*> candidate_tactics(const LayerSignature& sig);

}  // namespace kiln::backends
