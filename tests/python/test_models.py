"""Models ready on a device straight from a checkpoint (sluice.from_pretrained, load_model, empty_weights):
the same tensors and the same logits as the model they were saved from, tied weights one parameter, computed
buffers kept, mismatches refused before anything is read.  Skipped, and said so, without torch (the CPU
machine); the transformers and accelerate cases also without those.  The GPU machine has all three."""
import errno
import inspect
import json
import os
import struct

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


# What torch's load_state_dict counts as missing and unexpected, scenario by scenario: (names dropped from the
# state, tensors added to it).  A persistent buffer (body.steps) counts; a non-persistent one (body.freq) is no
# place for a tensor.
STRICT_CASES = {
    "the same": ((), {}),
    "a parameter missing": (("body.mlp.bias",), {}),
    "a persistent buffer missing": (("body.steps",), {}),
    "a tensor the module has no place for": ((), {"extra.weight": torch.ones(3)}),
    "a non-persistent buffer's name": ((), {"body.freq": torch.zeros(8)}),
    "a layer more than the module has": ((), {"body.mlp2.weight": torch.ones(32, 16), "body.mlp2.bias": torch.ones(32)}),
    "both": (("head.weight",), {"head2.weight": torch.ones(50, 16)}),
}


@pytest.mark.parametrize("case", STRICT_CASES)
def test_strict_counts_and_refuses_as_torch_load_state_dict(tmp_path, case):
    drop, extra = STRICT_CASES[case]
    torch.manual_seed(5)
    ref = Tiny(tie=False)
    state = {k: v.clone() for k, v in ref.state_dict().items() if k not in drop}
    state.update(extra)
    path = str(tmp_path / "c.safetensors")
    sluice.save(state, path)
    try:  # the peer
        Tiny(tie=False).load_state_dict(state, strict=True)
        refused = False
    except RuntimeError:
        refused = True
    want = Tiny(tie=False).load_state_dict(state, strict=False)
    with sluice.empty_weights():
        model = Tiny(tie=False)
    if refused:
        with pytest.raises(ValueError) as e:
            sluice.load_model(model, path, device="cpu")
        assert all(f"'{k}'" in str(e.value) for k in [*want.missing_keys, *want.unexpected_keys]), str(e.value)
        assert model.body.mlp.weight.is_meta  # refused before anything was read
        with sluice.empty_weights():
            model = Tiny(tie=False)
    rep = {}
    sluice.load_model(model, path, device="cpu", strict=not refused, report=rep)
    assert sorted(rep["missing_keys"]) == sorted(want.missing_keys)
    assert sorted(rep["unexpected_keys"]) == sorted(want.unexpected_keys)
    for k, v in model.state_dict().items():
        if k in state:
            assert torch.equal(v, state[k]), k
    assert model.body.steps.item() == 7  # missing, it keeps the value the module made, as torch's does


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
    theirs = transformers.LlamaForCausalLM.from_pretrained(path).to(device).eval()  # its default dtype, as sluice
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


def test_a_checkpoint_rewritten_between_check_and_read_fails_naming_the_tensor(tmp_path, monkeypatch):
    import sluice.models as models
    path = str(tmp_path / "model.safetensors")
    sluice.save({"weight": torch.full((4, 6), 1.5), "bias": torch.zeros(4)}, path)
    listed = sluice.checkpoint._listing(path)
    sluice.save({"weight": torch.arange(24, dtype=torch.int32).reshape(4, 6), "bias": torch.zeros(4)}, path)

    class Stale(sluice.checkpoint._Open):  # the check saw the old file (as an object store's listing may)
        def listing(self):
            return listed
    monkeypatch.setattr(models, "_Open", Stale)
    with sluice.empty_weights():
        model = nn.Linear(6, 4)
    with pytest.raises(sluice.SluiceError, match=r"tensor 'weight' changed between its check and its read") as e:
        sluice.load_model(model, path, device="cpu")
    assert e.value.code == -errno.ESTALE and model.weight.is_meta  # nothing placed


class Prefixed(nn.Module):
    base_model_prefix = "model"

    def __init__(self):
        super().__init__()
        self.model = nn.Module()
        self.model.norm = nn.LayerNorm(4)
        self.norm = nn.LayerNorm(4)


def test_the_base_model_prefix_is_decided_once_for_the_checkpoint(tmp_path):
    path = str(tmp_path / "c.safetensors")
    sluice.save({"model.norm.bias": torch.zeros(4), "norm.weight": torch.full((4,), 7.0), "norm.bias": torch.zeros(4)},
                path)
    with sluice.empty_weights():
        model = Prefixed()
    with pytest.raises(ValueError, match=r"lacks 1 of the model's tensors: 'model.norm.weight'"):
        sluice.load_model(model, path, device="cpu")  # not filled from norm.weight


def test_parameters_stay_the_same_objects(tmp_path):
    class Tagged(nn.Parameter):
        pass

    path = str(tmp_path / "l.safetensors")
    sluice.save({"weight": torch.ones(1, 2)}, path)
    model = nn.Linear(2, 1, bias=False)
    model.weight = Tagged(model.weight.detach())
    model.weight.no_weight_decay = True
    before = model.weight
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sluice.load_model(model, path, device="cpu")
    assert model.weight is before and type(model.weight) is Tagged and model.weight.no_weight_decay
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert torch.allclose(model.weight, torch.full((1, 2), 0.9))  # the optimizer's parameter is the model's


def test_a_tensor_that_is_a_parameter_and_a_buffer_gets_its_values_under_both(tmp_path):
    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(2))
            self.register_buffer("b", self.w)

    path = str(tmp_path / "pb.safetensors")
    sluice.save({"w": torch.full((2,), 3.0)}, path)
    with sluice.empty_weights():
        model = Both()
    sluice.load_model(model, path, device="cpu")
    assert torch.equal(model.state_dict()["b"], torch.full((2,), 3.0)) and model.b is model.w


def test_names_with_glob_characters_load_as_themselves(tmp_path):
    path = str(tmp_path / "g.safetensors")
    sluice.save({"a[0]": torch.ones(2), "a0": torch.zeros(2)}, path)
    got = sluice.load(path, device="cpu", keys=["a[0]"])
    assert list(got) == ["a[0]"] and torch.equal(got["a[0]"], torch.ones(2))
    assert sorted(sluice.load(path, device="cpu", keys=["a?"])) == ["a0"]  # still a glob where it is no name


def _f4_file(path):
    header = json.dumps({"w": {"dtype": "F4", "shape": [1, 6], "data_offsets": [0, 3]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + bytes(3))


def test_dtypes_that_cannot_convert_are_refused_before_reading(tmp_path):
    _f4_file(tmp_path / "f4.safetensors")
    with sluice.empty_weights():
        model = nn.Module()
        model.w = nn.Parameter(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"tensor 'w' is F4 \[1, 6\]; the model wants float32"):
        sluice.load_model(model, str(tmp_path / "f4.safetensors"), device="cpu")
    with pytest.raises(ValueError, match=r"dtype=torch.int32 is not a model's floating dtype"):
        sluice.load_model(model, str(tmp_path / "f4.safetensors"), device="cpu", dtype=torch.int32)


def test_from_pretrained_names_what_is_wrong_with_its_source(tmp_path):
    pytest.importorskip("transformers")
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_bytes(b"\xff{")
    with pytest.raises(sluice.SluiceError, match=r"m/config.json: not JSON"):
        sluice.from_pretrained(str(d), device="cpu")
    (d / "config.json").write_text(json.dumps({"model_type": ["llama"]}))
    with pytest.raises(sluice.SluiceError, match=r"config.json: model_type \['llama'\] is not one transformers"):
        sluice.from_pretrained(str(d), device="cpu")
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["pipeline"]}))
    with pytest.raises(ValueError, match=r"config.json names no model class transformers has \('pipeline'\)"):
        sluice.from_pretrained(str(d), device="cpu")
    with pytest.raises(TypeError, match=r"model_class=.* is not a torch.nn.Module class"):
        sluice.from_pretrained(str(d), print, device="cpu")
    with pytest.raises(ValueError, match=r"config.json is not a directory"):
        sluice.from_pretrained(str(d / "config.json"), device="cpu")
    with open(d / "config.json", "wb") as f:
        f.truncate((16 << 20) + 1)
    with pytest.raises(sluice.SluiceError, match=r"more than the 16777216 a config.json may hold"):
        sluice.from_pretrained(str(d), device="cpu")


def test_checkpoint_names_transformers_renames_load_by_its_rules_and_load_model_names_them(tmp_path):
    """GPT-NeoX's embed_out, its lm_head in transformers 5: from_pretrained renames it as transformers does (4's
    model's name is embed_out: nothing to rename); load_model, torch's rules, takes names as they are and says why
    they do not fit."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPTNeoXConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=4, vocab_size=64)
    transformers.GPTNeoXForCausalLM(cfg).save_pretrained(tmp_path / "neox")
    model = sluice.from_pretrained(str(tmp_path / "neox"), device="cpu")
    theirs = transformers.GPTNeoXForCausalLM.from_pretrained(tmp_path / "neox").eval()
    ids = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, theirs(ids).logits)
    if transformers.__version__.startswith("4."):
        return
    with sluice.empty_weights():
        bare = transformers.GPTNeoXForCausalLM(cfg)
    with pytest.raises(ValueError, match=r"lacks 1 .*'lm_head.weight'; it holds 1 the model has no place for: "
                                         r"'embed_out.weight' \(transformers renames .* sluice.from_pretrained "
                                         r"applies its rules, load_model takes the names as they are\)"):
        sluice.load_model(bare, str(tmp_path / "neox"), device="cpu")


def test_modules_transformers_keeps_in_float32_stay_float32(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.T5Config(d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16, vocab_size=64)
    transformers.T5ForConditionalGeneration(cfg).save_pretrained(tmp_path / "t5")
    theirs = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "t5", dtype=torch.float16)
    model = sluice.from_pretrained(str(tmp_path / "t5"), device="cpu", dtype="float16")
    mine, want = model.state_dict(), theirs.state_dict()
    assert any(k.endswith("wo.weight") and v.dtype == torch.float32 for k, v in want.items())
    for k in want:
        assert mine[k].dtype == want[k].dtype and torch.equal(mine[k], want[k]), k


def test_each_header_is_read_once_a_load(tmp_path, monkeypatch):
    """load_model lists the checkpoint (to plan the model's tensors) and reads it through the same opens: each
    file's header read once, not once for the listing and again for the read."""
    import sluice.checkpoint as ck
    d = str(tmp_path / "ck")
    sluice.save({"weight": torch.full((4, 6), 1.5), "bias": torch.arange(4.0)}, d, max_shard_size=64)
    files = [n for n in os.listdir(d) if n.endswith(".safetensors")]
    assert len(files) == 2
    opens, real = [], ck._Open.__init__

    def counted(self, src):
        real(self, src)
        opens.append(self.files)
    monkeypatch.setattr(ck._Open, "__init__", counted)
    with sluice.empty_weights():
        model = nn.Linear(6, 4)
    sluice.load_model(model, d, device="cpu")
    # One open of the checkpoint (the library's: each file's header read once there), its listing and its read.
    assert torch.equal(model.bias, torch.arange(4.0)) and len(opens) == 1
    assert sorted(os.path.basename(f) for f in opens[0]) == sorted(files)
