#!/usr/bin/env python3
"""A plain PyTorch GPT-2 training loop: the baseline Loom's GPU throughput is measured against.

The model is GPT-2 (pre-LayerNorm blocks, tanh GELU, tied input/output embeddings, GPT-2
initialisation), trained with bf16 autocast and fused AdamW on random tokens: exactly the work of
one training step of Loom's `gpt2-124m` preset, written the way a PyTorch user would write it.

It finds the largest micro-batch that fits (trying 64, 32, 16, ...), then times N warm-up and M
measured steps in eager mode and again under torch.compile, and prints one JSON object per mode
and a final summary object (also written to --json-out).

FLOPs per token follow Loom's planner (server/planner/model_shape.cc): 6*N + 6*L*C*T with
N = 12*L*C^2 + V*C, so both sides of the comparison count the same work.

Usage: torch_gpt2.py [--device cuda] [--budget-s 240] [--warmup 5] [--steps 20] [--json-out F]
Exit status: 0 on success (also when torch.compile fails: the error is reported), 1 when
PyTorch is missing or no run could be made, 2 on bad arguments.
"""

import argparse
import gc
import json
import math
import sys
import time

PEAK_FLOPS = 989e12  # H100/H200 SXM dense bf16, as in the planner's device table


def flops_per_token(layers, hidden, vocab, seq_len):
    """The planner's model FLOPs per trained token (forward and backward)."""
    n = 12.0 * layers * hidden * hidden + vocab * hidden
    return 6.0 * n + 6.0 * layers * hidden * seq_len


def mfu(tokens_per_second, layers, hidden, vocab, seq_len, peak=PEAK_FLOPS):
    return tokens_per_second * flops_per_token(layers, hidden, vocab, seq_len) / peak


def batch_candidates(largest):
    """64, 32, 16, ... 1 (starting at `largest`)."""
    b = largest
    out = []
    while b >= 1:
        out.append(b)
        b //= 2
    return out


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch", type=int, default=0, help="micro-batch; 0: the largest that fits")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="stop starting new work once this much wall time has passed")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--json-out", default="")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        p.error("--steps and --warmup must be at least 1")
    if args.hidden % args.heads != 0:
        p.error("--hidden must be a multiple of --heads")
    for mode in args.modes.split(","):
        if mode not in ("eager", "compile"):
            p.error(f"--modes: unknown mode {mode!r} (eager, compile)")
    return args


def build_model_class(torch):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self, C, NH):
            super().__init__()
            self.nh = NH
            self.ln1 = nn.LayerNorm(C)
            self.qkv = nn.Linear(C, 3 * C)
            self.attn_out = nn.Linear(C, C)
            self.ln2 = nn.LayerNorm(C)
            self.mlp_up = nn.Linear(C, 4 * C)
            self.mlp_down = nn.Linear(4 * C, C)

        def forward(self, x):  # x: (B, T, C)
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            # (B, NH, T, HS)
            q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attn_out(y.transpose(1, 2).reshape(B, T, C))
            return x + self.mlp_down(F.gelu(self.mlp_up(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self, L, C, NH, V, T):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(T, C)
            self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            # GPT-2 initialisation: N(0, 0.02), the residual projections scaled by 1/sqrt(2L).
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif "ln" in name:
                    nn.init.ones_(p)
                else:
                    std = 0.02
                    if name.endswith("attn_out.weight") or name.endswith("mlp_down.weight"):
                        std /= math.sqrt(2 * L)
                    nn.init.normal_(p, mean=0.0, std=std)

        def forward(self, idx, targets):  # idx, targets: (B, T)
            T = idx.shape[1]
            pos = torch.arange(T, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head: (B, T, V)
            return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))

    return GPT


class Trainer:
    """A model, its fused AdamW and a fixed batch of random tokens; step() trains once."""

    def __init__(self, torch, args, batch, compiled):
        self.torch = torch
        torch.manual_seed(args.seed)
        GPT = build_model_class(torch)
        dev = torch.device(args.device)
        self.model = GPT(args.layers, args.hidden, args.heads, args.vocab, args.seq_len).to(dev)
        self.n_params = sum(p.numel() for p in self.model.parameters())
        fused = dev.type == "cuda"
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=6e-4, betas=(0.9, 0.95),
                                     weight_decay=0.1, fused=fused)
        self.forward = torch.compile(self.model) if compiled else self.model
        g = torch.Generator(device="cpu").manual_seed(args.seed)
        data = torch.randint(0, args.vocab, (batch, args.seq_len + 1), generator=g)
        self.x = data[:, :-1].contiguous().to(dev)
        self.y = data[:, 1:].contiguous().to(dev)
        self.dtype = torch.bfloat16
        self.dev = dev

    def step(self):
        torch = self.torch
        with torch.autocast(device_type=self.dev.type, dtype=self.dtype):
            loss = self.forward(self.x, self.y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss

    def sync(self):
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize()


def release(torch):
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def is_oom(torch, e):
    if isinstance(e, getattr(torch.cuda, "OutOfMemoryError", ())):
        return True
    return "out of memory" in str(e).lower()


def find_batch(torch, args, log):
    """The largest micro-batch whose eager step (forward, backward, AdamW) runs twice."""
    if args.batch > 0:
        return args.batch
    for b in batch_candidates(args.max_batch):
        trainer = None
        try:
            trainer = Trainer(torch, args, b, compiled=False)
            for _ in range(2):
                trainer.step()
            trainer.sync()
            log(f"micro-batch {b}: fits")
            return b
        except RuntimeError as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
            if not is_oom(torch, e):
                raise
            log(f"micro-batch {b}: out of memory")
        finally:
            del trainer
            release(torch)
    raise RuntimeError("not even a micro-batch of 1 fits")


def run_mode(torch, args, batch, mode, deadline, log):
    """Times `mode`; returns its result dict (with "error" when it could not run)."""
    result = {"impl": f"torch-{mode}", "batch": batch, "seq_len": args.seq_len}
    trainer = None
    try:
        t0 = time.perf_counter()
        trainer = Trainer(torch, args, batch, compiled=(mode == "compile"))
        result["n_params"] = trainer.n_params
        first_loss = None
        for i in range(args.warmup):  # torch.compile compiles in the first step
            loss = trainer.step()
            if i == 0:
                first_loss = loss.detach().item()
            if time.perf_counter() > deadline:
                raise TimeoutError(f"time budget spent during warm-up (step {i + 1})")
        trainer.sync()
        result["warmup_s"] = round(time.perf_counter() - t0, 2)
        if torch.cuda.is_available() and trainer.dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        steps = 0
        t1 = time.perf_counter()
        while steps < args.steps:
            loss = trainer.step()
            steps += 1
            if time.perf_counter() > deadline:
                break
        trainer.sync()
        elapsed = time.perf_counter() - t1
        tokens = steps * batch * args.seq_len
        tps = tokens / elapsed
        result.update({
            "steps": steps,
            "step_ms": round(1e3 * elapsed / steps, 3),
            "tokens_per_s": round(tps, 1),
            "mfu": round(mfu(tps, args.layers, args.hidden, args.vocab, args.seq_len), 4),
            "loss_first": round(first_loss, 4) if first_loss is not None else None,
            "loss_last": round(loss.detach().item(), 4),
        })
        if trainer.dev.type == "cuda":
            result["peak_mem_bytes"] = torch.cuda.max_memory_allocated()
        log(f"{result['impl']}: {result['step_ms']} ms/step, {tps:.0f} tok/s, "
            f"MFU {100 * result['mfu']:.1f}%")
    except Exception as e:  # compile toolchain missing, OOM under compile, budget...
        result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        log(f"{result['impl']}: FAILED: {result['error']}")
    finally:
        del trainer
        release(torch)
    return result


def main(argv):
    args = parse_args(argv)
    start = time.perf_counter()
    deadline = start + args.budget_s

    def log(msg):
        print(f"torch_gpt2: {msg}", file=sys.stderr, flush=True)

    try:
        import torch
    except ImportError:
        print("torch_gpt2: PyTorch is not installed (import torch failed): no baseline",
              file=sys.stderr)
        return 1
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("torch_gpt2: no CUDA device visible to PyTorch: no baseline", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    log(f"torch {torch.__version__}, device {args.device}, "
        f"L={args.layers} C={args.hidden} NH={args.heads} V={args.vocab} T={args.seq_len}")

    summary = {
        "torch": torch.__version__,
        "flops_per_token": flops_per_token(args.layers, args.hidden, args.vocab, args.seq_len),
        "peak_flops": PEAK_FLOPS,
        "results": [],
    }
    try:
        batch = find_batch(torch, args, log)
    except Exception as e:
        log(f"no micro-batch could run: {e}")
        return 1
    summary["batch"] = batch
    for mode in args.modes.split(","):
        if time.perf_counter() > deadline:
            summary["results"].append({"impl": f"torch-{mode}", "error": "time budget spent"})
            continue
        r = run_mode(torch, args, batch, mode, deadline, log)
        print(json.dumps(r), flush=True)
        summary["results"].append(r)
    summary["wall_s"] = round(time.perf_counter() - start, 1)
    print(json.dumps({"summary": summary}), flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if any("error" not in r for r in summary["results"]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
