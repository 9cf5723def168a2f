#!/usr/bin/env python3
"""A small causal language model trained on packed rows delivered by sluice's loader into GPU memory.

    pip install "sluice[torch]"
    python3 examples/train_llm_packed.py [--sluice build/sluice] [--steps 200]

Makes an Alpaca-like token stream (lognormal document lengths, median 83 tokens), packs it into rows of
1024 tokens with `sluice pack --pack-context` (best-fit decreasing), and trains a 2-layer transformer on it
with AdamW. Labels are masked at document starts; a model with variable-length attention would also pass
cu_seqlens to keep documents from attending to each other. Prints the loss, tokens/s and sluice's verdict.
"""
import argparse
import os
import subprocess
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn

import sluice

VOCAB, L = 4096, 1024


def make_data(d, sluice_bin, docs=20000):
    rng = np.random.default_rng(0)
    lens = np.clip(np.exp(np.log(83) + 0.52 * rng.standard_normal(docs)), 13, 307).astype(np.int64)
    # Each document counts up from a random start: learnable, so the loss visibly falls.
    toks = np.concatenate([(rng.integers(0, VOCAB) + np.arange(n)) % VOCAB for n in lens]).astype(np.uint16)
    np.save(f"{d}/tok.npy", toks)
    np.save(f"{d}/len.npy", lens)
    subprocess.run([sluice_bin, "pack", "--from-tokens", f"{d}/tok.npy", "--doc-lengths", f"{d}/len.npy",
                    "--pack-context", str(L), f"{d}/rows"], check=True)
    return f"{d}/rows"


class TinyLM(nn.Module):
    def __init__(self, d=256):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, d), nn.Embedding(L, d)
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, ids, pos):
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
        return self.head(self.body(self.tok(ids) + self.pos(pos), mask=mask, is_causal=True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/var/tmp")) as d:
        ds = sluice.Dataset(make_data(d, a.sluice))
        ld = sluice.Loader(ds, shuffle=True, batch_size=a.batch, device=a.device, fields=["input_ids", "position_ids", "labels"],
                           drop_last=True, seed=1)
        model = TinyLM().to(a.device)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        step, tokens, epoch, t0 = 0, 0, 0, time.perf_counter()
        with sluice.profile(ld):
            while step < a.steps:
                for b in ld:
                    ids, pos, lab = (torch.as_tensor(b[k]).long() for k in ("input_ids", "position_ids", "labels"))
                    logits = model(ids, pos)
                    # Predict token t+1 from tokens <= t; labels already mask each document's first token.
                    loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), lab[:, 1:].reshape(-1),
                                                       ignore_index=-100)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    tokens += int((lab != -100).sum())
                    step += 1
                    if step % 50 == 0 or step == a.steps:
                        print(f"step {step}: loss {loss.item():.3f}", flush=True)
                    if step == a.steps:
                        break
                epoch += 1
                ld.set_epoch(epoch)
        if a.device != "cpu":
            torch.cuda.synchronize()
        print(f"{tokens / (time.perf_counter() - t0):,.0f} real tokens/s")


if __name__ == "__main__":
    main()
