"""sluice's checkpoints against Hugging Face transformers itself: a model transformers saved loads into a model
with tied weights (GPT-2's lm_head is its embedding) and gives the same logits; a checkpoint sluice saved, sharded,
is what from_pretrained reads.  The models are made from small configs (no download).  Skipped, and said so,
without torch and transformers (the CPU machine); the GPU machine has both."""
import json
import os

import pytest

import sluice

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _gpt2(seed):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=101, n_positions=64)
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize("device", DEVICES)
def test_a_model_transformers_saved_loads_into_a_tied_model(tmp_path, device):
    src = _gpt2(1)
    src.save_pretrained(tmp_path / "m", max_shard_size="20KB")
    names = set(json.load(open(tmp_path / "m" / "model.safetensors.index.json"))["weight_map"])
    assert "lm_head.weight" not in names  # tied: transformers stores the embedding alone
    dst = _gpt2(2).to(device)
    assert dst.lm_head.weight.data_ptr() == dst.transformer.wte.weight.data_ptr()
    rep = {}
    got = sluice.load(str(tmp_path / "m"), into=dst.state_dict(), report=rep)
    assert "lm_head.weight" in got and rep["files"] > 1
    ids = torch.randint(0, 101, (2, 16))
    dst = dst.cpu()  # the same device as src's, so the logits are bit for bit the same
    assert dst.lm_head.weight.data_ptr() == dst.transformer.wte.weight.data_ptr()
    with torch.no_grad():
        assert torch.equal(src(ids).logits, dst(ids).logits)


def test_a_checkpoint_sluice_saved_is_what_from_pretrained_reads(tmp_path):
    src = _gpt2(3)
    src.config.save_pretrained(tmp_path / "m")
    state = {k: v for k, v in src.state_dict().items() if k != "lm_head.weight"}  # tied, as transformers saves
    sluice.save(state, str(tmp_path / "m"), max_shard_size=20_000)
    shards = sorted(f for f in os.listdir(tmp_path / "m") if f.endswith(".safetensors"))
    assert len(shards) > 1
    dst = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "m").eval()
    ids = torch.randint(0, 101, (2, 16))
    with torch.no_grad():
        assert torch.equal(src(ids).logits, dst(ids).logits)
    # Saved again into the same directory: only the new save's shards remain, and they load.
    sluice.save(state, str(tmp_path / "m"), max_shard_size=20_000)
    again = sorted(f for f in os.listdir(tmp_path / "m") if f.endswith(".safetensors"))
    assert len(again) == len(shards) and not set(again) & set(shards)
    dst = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "m").eval()
    with torch.no_grad():
        assert torch.equal(src(ids).logits, dst(ids).logits)
