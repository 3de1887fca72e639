"""Transformers written in torch the way Hugging Face's modeling_*.py files write them (transformers
4.x, eager attention), small configs: the export shows the same op patterns as a real HF checkpoint
(view/permute head splits, Conv1D addmm, causal mask by torch.where on a bool buffer, T5's RMS norm and
relative position buckets, Whisper's strided 1-D convolutions and bmm attention).

Deviations, all for random inputs (kiln bench and ort_runner.js make integer inputs in [0, 10)):
- BERT's type_vocab_size is 10 (real: 2), so that random token_type_ids stay in range;
- BERT's additive mask uses -10000 (HF before 4.21), not finfo.min: with random mask values up to 9,
  (1 - mask) * finfo.min would overflow to inf;
- the T5 encoder takes no attention_mask (unpadded input), so its relative position bias is the only
  additive term of the scores.
"""
import math

import torch
from torch import nn


def _init(module, std=0.02):
    """HF's _init_weights: normal(0, 0.02) linears and embeddings, zero biases, unit norms."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding, nn.Conv1d)):
            m.weight.data.normal_(0.0, std)
            if getattr(m, "bias", None) is not None:
                m.bias.data.zero_()
        elif isinstance(m, nn.LayerNorm):
            m.weight.data.fill_(1.0)
            m.bias.data.zero_()
    return module


# ----------------------------------------------------------------------------------------------- BERT
class BertEmbeddings(nn.Module):
    def __init__(self, vocab, hidden, max_pos, type_vocab):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_pos, hidden)
        self.token_type_embeddings = nn.Embedding(type_vocab, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)
        self.register_buffer("position_ids", torch.arange(max_pos).expand((1, -1)))

    def forward(self, input_ids, token_type_ids):
        seq_length = input_ids.size(1)
        position_ids = self.position_ids[:, :seq_length]
        emb = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        emb = emb + self.position_embeddings(position_ids)
        return self.LayerNorm(emb)


class BertSelfAttention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.num_attention_heads, self.attention_head_size = heads, hidden // heads
        self.all_head_size = hidden
        self.query, self.key, self.value = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)

    def transpose_for_scores(self, x):
        new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        return x.view(new_x_shape).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask):
        q = self.transpose_for_scores(self.query(hidden_states))
        k = self.transpose_for_scores(self.key(hidden_states))
        v = self.transpose_for_scores(self.value(hidden_states))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.attention_head_size)
        probs = nn.functional.softmax(scores + attention_mask, dim=-1)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return ctx.view(ctx.size()[:-2] + (self.all_head_size,))


class BertLayer(nn.Module):
    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.attention = BertSelfAttention(hidden, heads)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_ln = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, ffn)
        self.output = nn.Linear(ffn, hidden)
        self.out_ln = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x, mask):
        x = self.attn_ln(self.attn_out(self.attention(x, mask)) + x)
        return self.out_ln(self.output(nn.functional.gelu(self.intermediate(x))) + x)


class BertModel(nn.Module):
    def __init__(self, vocab=1000, hidden=256, layers=4, heads=4, ffn=1024, max_pos=512, type_vocab=10):
        super().__init__()
        self.embeddings = BertEmbeddings(vocab, hidden, max_pos, type_vocab)
        self.layer = nn.ModuleList([BertLayer(hidden, heads, ffn) for _ in range(layers)])
        self.pooler = nn.Linear(hidden, hidden)

    def forward(self, input_ids, token_type_ids, attention_mask):
        x = self.embeddings(input_ids, token_type_ids)
        ext = attention_mask[:, None, None, :].to(dtype=x.dtype)  # get_extended_attention_mask
        ext = (1.0 - ext) * -10000.0
        for layer in self.layer:
            x = layer(x, ext)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return x, pooled


# ---------------------------------------------------------------------------------------------- GPT-2
class Conv1D(nn.Module):
    """HF's GPT-2 Conv1D: a linear layer with transposed weights, computed by addmm."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf).normal_(0.0, 0.02))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, hidden, heads, max_pos):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones((max_pos, max_pos), dtype=torch.bool)).view(
            1, 1, max_pos, max_pos))
        self.num_heads, self.head_dim, self.embed_dim = heads, hidden // heads, hidden
        self.c_attn = Conv1D(3 * hidden, hidden)
        self.c_proj = Conv1D(hidden, hidden)

    def _split_heads(self, t):
        return t.view(t.size()[:-1] + (self.num_heads, self.head_dim)).permute(0, 2, 1, 3)

    def forward(self, x):
        query, key, value = self.c_attn(x).split(self.embed_dim, dim=2)
        query, key, value = self._split_heads(query), self._split_heads(key), self._split_heads(value)
        w = torch.matmul(query, key.transpose(-1, -2))
        w = w / torch.full([], value.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length:key_length, :key_length]
        mask_value = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)
        w = torch.where(causal_mask, w.to(w.dtype), mask_value)
        w = nn.functional.softmax(w, dim=-1)
        out = torch.matmul(w, value).permute(0, 2, 1, 3).contiguous()
        out = out.view(out.size()[:-2] + (self.num_heads * self.head_dim,))
        return self.c_proj(out)


class GPT2Block(nn.Module):
    def __init__(self, hidden, heads, max_pos):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=1e-5)
        self.attn = GPT2Attention(hidden, heads, max_pos)
        self.ln_2 = nn.LayerNorm(hidden, eps=1e-5)
        self.c_fc = Conv1D(4 * hidden, hidden)
        self.mlp_proj = Conv1D(hidden, 4 * hidden)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(gelu_new(self.c_fc(self.ln_2(x))))


class GPT2LMHeadModel(nn.Module):
    def __init__(self, vocab=1000, hidden=384, layers=4, heads=6, max_pos=1024):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(max_pos, hidden)
        self.h = nn.ModuleList([GPT2Block(hidden, heads, max_pos) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(hidden, eps=1e-5)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids):
        position_ids = torch.arange(0, input_ids.size(-1), dtype=torch.long, device=input_ids.device).unsqueeze(0)
        x = self.wte(input_ids) + self.wpe(position_ids)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def tie(self):
        self.lm_head.weight = self.wte.weight  # tied input/output embeddings, as GPT-2
        return self


# ------------------------------------------------------------------------------------------------- T5
class T5LayerNorm(nn.Module):
    """RMS norm without mean subtraction or bias, computed in float32."""

    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, x):
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))


class T5Attention(nn.Module):
    def __init__(self, d_model, d_kv, heads, has_relative_attention_bias, num_buckets=32, max_distance=128):
        super().__init__()
        self.n_heads, self.key_value_proj_dim, self.inner_dim = heads, d_kv, heads * d_kv
        self.q = nn.Linear(d_model, self.inner_dim, bias=False)
        self.k = nn.Linear(d_model, self.inner_dim, bias=False)
        self.v = nn.Linear(d_model, self.inner_dim, bias=False)
        self.o = nn.Linear(self.inner_dim, d_model, bias=False)
        self.num_buckets, self.max_distance = num_buckets, max_distance
        if has_relative_attention_bias:
            self.relative_attention_bias = nn.Embedding(num_buckets, heads)

    @staticmethod
    def _relative_position_bucket(relative_position, num_buckets, max_distance):
        num_buckets //= 2  # bidirectional
        relative_buckets = (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
        max_exact = num_buckets // 2
        is_small = relative_position < max_exact
        large = max_exact + (torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact) *
                             (num_buckets - max_exact)).to(torch.long)
        large = torch.min(large, torch.full_like(large, num_buckets - 1))
        return relative_buckets + torch.where(is_small, relative_position, large)

    def compute_bias(self, query_length, key_length, device):
        context_position = torch.arange(query_length, dtype=torch.long, device=device)[:, None]
        memory_position = torch.arange(key_length, dtype=torch.long, device=device)[None, :]
        buckets = self._relative_position_bucket(memory_position - context_position, self.num_buckets, self.max_distance)
        values = self.relative_attention_bias(buckets)  # [q, k, heads]
        return values.permute([2, 0, 1]).unsqueeze(0)  # [1, heads, q, k]

    def forward(self, x, position_bias=None):
        b, s = x.shape[:2]

        def shape(t):
            return t.view(b, -1, self.n_heads, self.key_value_proj_dim).transpose(1, 2)

        q, k, v = shape(self.q(x)), shape(self.k(x)), shape(self.v(x))
        scores = torch.matmul(q, k.transpose(3, 2))  # no 1/sqrt(d): folded into T5's initialization
        if position_bias is None:
            position_bias = self.compute_bias(s, s, x.device)
        scores = scores + position_bias
        w = nn.functional.softmax(scores.float(), dim=-1).type_as(scores)
        out = torch.matmul(w, v).transpose(1, 2).contiguous().view(b, -1, self.inner_dim)
        return self.o(out), position_bias


class T5Block(nn.Module):
    def __init__(self, d_model, d_kv, heads, d_ff, first):
        super().__init__()
        self.ln_attn = T5LayerNorm(d_model)
        self.SelfAttention = T5Attention(d_model, d_kv, heads, first)
        self.ln_ff = T5LayerNorm(d_model)
        self.wi_0 = nn.Linear(d_model, d_ff, bias=False)  # T5DenseGatedActDense (t5 v1.1 / flan-t5)
        self.wi_1 = nn.Linear(d_model, d_ff, bias=False)
        self.wo = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x, position_bias):
        attn, position_bias = self.SelfAttention(self.ln_attn(x), position_bias)
        x = x + attn
        h = self.ln_ff(x)
        return x + self.wo(gelu_new(self.wi_0(h)) * self.wi_1(h)), position_bias


class T5EncoderModel(nn.Module):
    def __init__(self, vocab=1000, d_model=256, d_kv=64, heads=4, d_ff=1024, layers=4):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d_model)
        self.block = nn.ModuleList([T5Block(d_model, d_kv, heads, d_ff, i == 0) for i in range(layers)])
        self.final_layer_norm = T5LayerNorm(d_model)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        position_bias = None  # computed by the first layer, shared by all
        for blk in self.block:
            x, position_bias = blk(x, position_bias)
        return self.final_layer_norm(x)


# -------------------------------------------------------------------------------------------- Whisper
class WhisperAttention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.num_heads, self.head_dim = heads, d // heads
        self.scaling = self.head_dim ** -0.5
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d)
        self.q_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)

    def _shape(self, t, seq_len, bsz):
        return t.view(bsz, seq_len, self.num_heads, self.head_dim).transpose(1, 2).contiguous()

    def forward(self, x):
        bsz, tgt_len, embed_dim = x.size()
        q = self._shape(self.q_proj(x) * self.scaling, tgt_len, bsz)
        k = self._shape(self.k_proj(x), -1, bsz)
        v = self._shape(self.v_proj(x), -1, bsz)
        proj_shape = (bsz * self.num_heads, -1, self.head_dim)
        q, k, v = q.view(*proj_shape), k.reshape(*proj_shape), v.reshape(*proj_shape)
        w = nn.functional.softmax(torch.bmm(q, k.transpose(1, 2)), dim=-1)
        out = torch.bmm(w, v).view(bsz, self.num_heads, tgt_len, self.head_dim).transpose(1, 2)
        return self.out_proj(out.reshape(bsz, tgt_len, embed_dim))


class WhisperEncoderLayer(nn.Module):
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.self_attn = WhisperAttention(d, heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, x):
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.final_layer_norm(x))))


def sinusoids(length, channels, max_timescale=10000):
    log_timescale_increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-log_timescale_increment * torch.arange(channels // 2))
    scaled_time = torch.arange(length)[:, None] * inv_timescales[None, :]
    return torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)


class WhisperEncoder(nn.Module):
    def __init__(self, num_mel_bins=80, d=384, layers=4, heads=6, ffn=1536, max_source_positions=1500):
        super().__init__()
        self.conv1 = nn.Conv1d(num_mel_bins, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(max_source_positions, d)
        self.layers = nn.ModuleList([WhisperEncoderLayer(d, heads, ffn) for _ in range(layers)])
        self.layer_norm = nn.LayerNorm(d)

    def forward(self, input_features):
        x = nn.functional.gelu(self.conv1(input_features))
        x = nn.functional.gelu(self.conv2(x)).permute(0, 2, 1)
        x = x + self.embed_positions.weight[:x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


def make(kind):
    """(module, example inputs at batch 1) for bench/suite/models.py."""
    torch.manual_seed(0)
    seq = 128
    if kind == "bert":
        ids = torch.randint(0, 10, (1, seq))
        types = torch.zeros(1, seq, dtype=torch.int64)
        types[:, seq // 2:] = 1
        mask = torch.ones(1, seq, dtype=torch.int64)
        mask[:, 100:] = 0
        return _init(BertModel()), (ids, types, mask)
    if kind == "gpt2":
        return _init(GPT2LMHeadModel()).tie(), (torch.randint(0, 10, (1, seq)),)
    if kind == "t5":
        m = _init(T5EncoderModel(), std=0.05)
        return m, (torch.randint(0, 10, (1, seq)),)
    if kind == "whisper":
        m = _init(WhisperEncoder(max_source_positions=500))
        with torch.no_grad():
            m.embed_positions.weight.copy_(sinusoids(500, 384))
        return m, (torch.randn(1, 80, 1000),)
    raise ValueError(f"unknown transformer kind {kind}")
