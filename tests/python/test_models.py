"""Models ready on a device straight from a checkpoint (sluice.from_pretrained, load_model, empty_weights):
the same tensors and the same logits as the model they were saved from, tied weights one parameter, computed
buffers kept, mismatches refused before anything is read.  Skipped, and said so, without torch (the CPU
machine); the transformers and accelerate cases also without those.  The GPU machine has all three."""
import inspect

import pytest

import sluice
from conftest import run_ranks

torch = pytest.importorskip("torch")
nn = torch.nn

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


class Tiny(nn.Module):
    """A small language model's parts: an embedding tied to the head, a computed (non-persistent) buffer, a
    persistent buffer, and a frozen parameter."""
    base_model_prefix = "body"

    def __init__(self, tie=True):
        super().__init__()
        self.body = nn.Module()
        self.body.embed = nn.Embedding(50, 16)
        self.body.mlp = nn.Linear(16, 32)
        self.body.scale = nn.Parameter(torch.ones(32), requires_grad=False)
        self.body.register_buffer("freq", torch.arange(8, dtype=torch.float32) / 8, persistent=False)
        self.body.register_buffer("steps", torch.tensor([7], dtype=torch.int64))
        self.head = nn.Linear(16, 50, bias=False)
        if tie:
            self.head.weight = self.body.embed.weight

    def forward(self, ids):
        h = self.body.embed(ids) * self.body.freq.sum()
        return self.head(h + self.body.mlp(h)[..., :16] * self.body.scale[:16])


def _saved(tmp_path, model, drop=(), **kw):
    """model's state saved as safetensors (tied tensors once, as transformers saves them); returns the path."""
    state, seen = {}, set()
    for k, v in model.state_dict().items():
        if v.data_ptr() not in seen and k not in drop:
            seen.add(v.data_ptr())
            state[k] = v.contiguous()
    path = str(tmp_path / "ckpt")
    sluice.save({**state, **kw}, path, max_shard_size=2000)
    return path


@pytest.mark.parametrize("device", DEVICES)
def test_a_module_built_without_weights_loads_to_the_same_outputs(tmp_path, device):
    torch.manual_seed(0)
    ref = Tiny().eval()
    path = _saved(tmp_path, ref)
    with sluice.empty_weights():
        model = Tiny()
    assert model.head.weight.is_meta and model.head.weight is model.body.embed.weight
    assert model.body.freq.device.type == "cpu"  # buffers made as usual
    rep = {}
    got = sluice.load_model(model, path, device=device, report=rep)
    assert got is model and rep["missing_keys"] == [] and rep["unexpected_keys"] == [] and rep["untied"] == []
    assert model.head.weight is model.body.embed.weight  # still one parameter
    assert rep["tensors"] == 5  # the embedding read once for its two names
    for name, t in model.state_dict().items():
        assert t.device.type == device and torch.equal(t.cpu(), ref.state_dict()[name]), name
    assert not model.body.scale.requires_grad and model.body.mlp.weight.requires_grad
    assert torch.equal(model.body.freq.cpu(), ref.body.freq)
    ids = torch.randint(0, 50, (2, 5), device=device)
    with torch.no_grad():
        assert torch.equal(model.eval()(ids), ref.to(device)(ids))


def test_dtype_converts_floating_tensors_only(tmp_path):
    torch.manual_seed(1)
    ref = Tiny()
    path = _saved(tmp_path, ref)
    with sluice.empty_weights():
        model = Tiny()
    sluice.load_model(model, path, device="cpu", dtype=torch.bfloat16)
    assert model.body.mlp.weight.dtype == torch.bfloat16
    assert torch.equal(model.body.mlp.weight, ref.body.mlp.weight.to(torch.bfloat16))
    assert model.body.steps.dtype == torch.int64 and model.body.steps.item() == 7
    assert model.head.weight is model.body.embed.weight


def test_missing_tensors_are_refused_before_reading_or_zeros_when_not_strict(tmp_path):
    ref = Tiny()
    path = _saved(tmp_path, ref, drop=("body.mlp.bias",), extra=torch.ones(3))
    with sluice.empty_weights():
        model = Tiny()
    with pytest.raises(ValueError, match=r"lacks 1 of the model's tensors: 'body.mlp.bias'.*strict=False"):
        sluice.load_model(model, path, device="cpu")
    assert model.body.mlp.weight.is_meta  # nothing was placed
    rep = {}
    sluice.load_model(model, path, device="cpu", strict=False, report=rep)
    assert rep["missing_keys"] == ["body.mlp.bias"] and rep["unexpected_keys"] == ["extra"]
    assert torch.equal(model.body.mlp.bias, torch.zeros(32)) and "extra" not in model.state_dict()
    assert torch.equal(model.body.mlp.weight, ref.body.mlp.weight)


def test_a_shape_or_dtype_that_does_not_fit_is_named_before_reading(tmp_path):
    ref = Tiny()
    state = {k: v for k, v in ref.state_dict().items() if k != "head.weight"}
    state["body.mlp.weight"] = torch.zeros(32, 15)
    path = str(tmp_path / "bad")
    sluice.save(state, path)
    with sluice.empty_weights():
        model = Tiny()
    with pytest.raises(ValueError, match=r"'body.mlp.weight' is F32 \[32, 15\]; the model wants float32 \[32, 16\]"):
        sluice.load_model(model, path, device="cpu")
    state["body.mlp.weight"] = ref.body.mlp.weight
    state["body.steps"] = torch.tensor([7.0])
    sluice.save(state, path)
    with pytest.raises(ValueError, match=r"'body.steps' is F32 \[1\]; the model wants int64 \[1\]"):
        sluice.load_model(model, path, device="cpu")


def test_tied_in_the_model_but_different_in_the_checkpoint_are_untied(tmp_path):
    ref = Tiny(tie=False)
    assert not torch.equal(ref.head.weight, ref.body.embed.weight)
    path = _saved(tmp_path, ref)
    with sluice.empty_weights():
        model = Tiny(tie=True)
    rep = {}
    sluice.load_model(model, path, device="cpu", report=rep)
    assert rep["untied"] == [["body.embed.weight", "head.weight"]]
    assert model.head.weight is not model.body.embed.weight
    assert torch.equal(model.head.weight, ref.head.weight) and torch.equal(model.body.embed.weight,
                                                                           ref.body.embed.weight)
    # The same values under both names stay one parameter.
    ref.head.weight = ref.body.embed.weight
    path = str(tmp_path / "both")
    sluice.save({k: v.clone() for k, v in ref.state_dict().items()}, path)
    with sluice.empty_weights():
        model = Tiny(tie=True)
    sluice.load_model(model, path, device="cpu", report=rep)
    assert rep["untied"] == [] and model.head.weight is model.body.embed.weight


def test_a_checkpoint_of_the_base_model_fits_a_model_with_a_head(tmp_path):
    ref = Tiny(tie=False)
    state = {k[len("body."):] if k.startswith("body.") else k: v for k, v in ref.state_dict().items()}
    path = str(tmp_path / "base")
    sluice.save(state, path)
    with sluice.empty_weights():
        model = Tiny(tie=False)
    sluice.load_model(model, path, device="cpu")
    assert torch.equal(model.body.mlp.weight, ref.body.mlp.weight) and torch.equal(model.head.weight,
                                                                                   ref.head.weight)


# One rank of a group loading Tiny with process_group= (argv: the checkpoint, the backend, the device or "rank").
GROUP_RANK = """
import json, os, sys, torch, torch.distributed as dist, sluice
from torch import nn
%s
path, backend, dev = sys.argv[1:4]
dist.init_process_group(backend)
rank = dist.get_rank()
dev = f"cuda:{rank}" if dev == "rank" else dev
alone = sluice.load(path, device="cpu")
with sluice.empty_weights():
    model = Tiny()
rep = {}
sluice.load_model(model, path, device=dev, process_group=dist.group.WORLD, report=rep)
state = model.state_dict()
bad = [k for k in state if k in alone and not torch.equal(state[k].cpu(), alone[k])]
print(json.dumps({"bad": bad, "tied": model.head.weight is model.body.embed.weight, "bytes": rep["bytes"],
                  "exchanged": rep["bytes_exchanged"]}))
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_a_process_group_loads_a_model_reading_each_byte_once(tmp_path, backend):
    world, dev = 2, "cpu"
    if backend == "nccl":
        if torch.cuda.device_count() < 2:
            pytest.skip("fewer than two GPUs")
        dev = "rank"
    path = _saved(tmp_path, Tiny())
    whole = sum(t.numel() * t.element_size() for t in sluice.load(path, device="cpu").values())
    reps = run_ranks(GROUP_RANK % inspect.getsource(Tiny), (path, backend, dev), world)
    assert all(r["bad"] == [] and r["tied"] for r in reps), reps
    assert sum(r["bytes"] for r in reps) == whole and all(r["exchanged"] > 0 for r in reps), reps


def test_buffers_on_meta_that_no_checkpoint_holds_are_refused(tmp_path):
    path = _saved(tmp_path, Tiny())
    with torch.device("meta"):
        model = Tiny()
    with pytest.raises(ValueError, match=r"buffers body.freq are on the meta device.*empty_weights"):
        sluice.load_model(model, path, device="cpu")


def test_empty_weights_is_undone_after_its_block_and_after_an_error():
    register = nn.Module.register_parameter
    with pytest.raises(RuntimeError):
        with sluice.empty_weights():
            assert nn.Linear(2, 2).weight.is_meta
            raise RuntimeError("in the block")
    assert nn.Module.register_parameter is register and not nn.Linear(2, 2).weight.is_meta


def _llama(tmp_path, tie):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(2)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
                                   tie_word_embeddings=tie)
    ref = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    ref.save_pretrained(tmp_path / "llama", max_shard_size="100KB")
    return transformers, ref, str(tmp_path / "llama")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tie", [True, False])
def test_from_pretrained_gives_transformers_model_and_logits(tmp_path, device, tie):
    transformers, ref, path = _llama(tmp_path, tie)
    theirs = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
    rep = {}
    model = sluice.from_pretrained(path, device=device, report=rep)
    assert type(model) is transformers.LlamaForCausalLM and not model.training
    assert rep["files"] > 1 and rep["missing_keys"] == []
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tie
    mine, want = model.state_dict(), theirs.state_dict()
    assert set(mine) == set(want)
    for k in want:
        assert mine[k].dtype == want[k].dtype and torch.equal(mine[k], want[k]), k
    for (n, b), (_, w) in zip(model.named_buffers(), theirs.named_buffers()):
        assert b.device == w.device and torch.equal(b, w), n
    ids = torch.randint(0, 96, (2, 12), device=device)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, theirs(ids).logits)


def test_from_pretrained_dtype_and_accelerate_users(tmp_path):
    transformers, ref, path = _llama(tmp_path, True)
    model = sluice.from_pretrained(path, transformers.LlamaForCausalLM, device="cpu", dtype="float32")
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.float32
    assert torch.equal(model.model.layers[0].mlp.up_proj.weight, ref.model.layers[0].mlp.up_proj.weight.float())
    accelerate = pytest.importorskip("accelerate")
    with accelerate.init_empty_weights():
        model = transformers.LlamaForCausalLM(ref.config)
    sluice.load_model(model, path, device="cpu", dtype=torch.bfloat16)
    theirs = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, 96, (1, 9))
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, theirs(ids).logits)
