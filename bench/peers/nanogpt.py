"""nanoGPT's GPT (karpathy/nanoGPT model.py) re-typed for PyTorch 1.13, which has no
F.scaled_dot_product_attention: the causal attention is written out (masked softmax), as
nanoGPT's own fallback. The state_dict names are nanoGPT's, so weights move to and from
Phalanx's nn::GPT as .npz. Also Phalanx's byte-level text windows (data/text_dataset.hpp)
and its sampler's shuffle (samplers/shuffle.hpp), so a PyTorch run can see the same
windows in the same order as phalanx-train. Used by torch_gpt_step.py and
torch_gpt_train.py."""
import math
import os

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F


class LayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout, bias):
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.n_embd = n_head, n_embd
        self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size),
                             persistent=False)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd, dropout, bias):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout, bias):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, dropout, bias)
        self.ln_2 = LayerNorm(n_embd, bias)
        self.mlp = MLP(n_embd, dropout, bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size=256, dropout=0.0, bias=True):
        super().__init__()
        self.block_size = block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList([Block(n_embd, n_head, block_size, dropout, bias) for _ in range(n_layer)]),
            ln_f=LayerNorm(n_embd, bias),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied, as nanoGPT
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def optimizer(self, lr, weight_decay, betas):
        """AdamW with the groups nn::decay_groups makes: Linear weights decay; biases,
        LayerNorms and the embeddings (wte = lm_head, wpe) do not. Group 0 decays."""
        decay = {f"{mn}.weight" for mn, m in self.named_modules() if isinstance(m, nn.Linear)}
        decay.discard("lm_head.weight")  # it is transformer.wte.weight, an embedding
        named = dict(self.named_parameters())  # the tied tensor once, as transformer.wte.weight
        groups = [{"params": [p for n, p in named.items() if n in decay], "weight_decay": weight_decay},
                  {"params": [p for n, p in named.items() if n not in decay], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=betas)


def save_npz(model, path):
    """The state_dict as .npz with nanoGPT's names (both names of the tied tensor)."""
    np.savez(path, **{k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})


def load_npz(model, path):
    with np.load(path) as f:
        state = {k: torch.from_numpy(f[k]) for k in f.files}
    if "lm_head.weight" not in state:
        state["lm_head.weight"] = state["transformer.wte.weight"]
    model.load_state_dict(state)


# ---- Phalanx's data: text windows and the sampler's shuffle ----

FORTUNES_DIR = "/usr/share/games/fortunes"


def fortune_files(directory=FORTUNES_DIR):
    """As samplers::fortune_files: regular files that are not .dat or .u8, sorted by name."""
    names = sorted(n for n in os.listdir(directory) if not n.startswith(".") and not n.endswith((".dat", ".u8")))
    return [os.path.join(directory, n) for n in names if os.path.isfile(os.path.join(directory, n))
            and not os.path.islink(os.path.join(directory, n))]


def load_text(files):
    return np.frombuffer(b"".join(open(f, "rb").read() for f in files), dtype=np.uint8)


def split(data):
    """nanoGPT's prepare split: the first int(n * 0.9) bytes train, the rest validate."""
    cut = int(len(data) * 0.9)
    return data[:cut], data[cut:]


def windows(part, context, stride):
    """Window i: bytes [i * stride, i * stride + context] of `part` (inputs, next-byte targets)."""
    count = (len(part) - context - 1) // stride + 1
    starts = np.arange(count, dtype=np.int64) * stride
    rows = starts[:, None] + np.arange(context + 1, dtype=np.int64)[None, :]
    w = torch.from_numpy(part[rows].astype(np.int64))
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


_M64 = (1 << 64) - 1


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & _M64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return x, z ^ (z >> 31)


class Pcg32:
    """Phalanx's Generator (core/generator.cpp): PCG32 seeded through SplitMix64."""

    def __init__(self, seed):
        sm, init_state = _splitmix64(seed & _M64)
        _, stream = _splitmix64(sm)
        self.state, self.inc = 0, ((stream << 1) | 1) & _M64
        self.next_u32()
        self.state = (self.state + init_state) & _M64
        self.next_u32()

    def next_u32(self):
        old = self.state
        self.state = (old * 6364136223846793005 + self.inc) & _M64
        xorshifted = (((old >> 18) ^ old) >> 27) & 0xFFFFFFFF
        rot = old >> 59
        return ((xorshifted >> rot) | (xorshifted << ((32 - rot) & 31))) & 0xFFFFFFFF

    def below(self, n):
        limit = (-n % (1 << 32)) % n
        while True:
            r = self.next_u32()
            if r >= limit:
                return r % n


def shuffled_order(n, seed, epoch):
    """samplers::shuffled_order: Fisher-Yates with Generator(seed + epoch)."""
    order = list(range(n))
    g = Pcg32(seed + epoch)
    for i in range(n - 1, 0, -1):
        j = g.below(i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def global_batches(n, global_batch, world, seed, epoch, shuffle=True):
    """The windows of each step of phalanx-train on `world` workers with --drop-last: the
    DistributedSampler's order cut to a multiple of `world`, rank r its entries r, r + W, ...,
    each rank's loader full batches of global_batch / world. Step k's global batch is the
    union of the ranks' k-th batches, i.e. order[k * B : (k + 1) * B]."""
    order = shuffled_order(n, seed, epoch) if shuffle else list(range(n))
    per_rank = n // world
    order = order[:per_rank * world]
    local = global_batch // world
    steps = per_rank // local
    return [order[k * global_batch:(k + 1) * global_batch] for k in range(steps)]
