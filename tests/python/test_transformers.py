"""sluice's checkpoints against Hugging Face transformers itself: a model transformers saved loads into a model
with tied weights (GPT-2's lm_head is its embedding) and gives the same logits; a checkpoint sluice saved, sharded,
is what from_pretrained reads.  The models are made from small configs (no download).  Skipped, and said so,
without torch and transformers (the CPU machine); the GPU machine has both."""
import importlib
import importlib.util
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


# sluice.from_pretrained against transformers' from_pretrained of the same directory, under whichever transformers
# is installed (4.57 and 5.x are what sluice mirrors): tiny models of several architectures, made from configs.
ARCHS = {
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(n_layer=2, n_head=2, n_embd=32, vocab_size=101, n_positions=64)),
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=101,
                                                      max_position_embeddings=64)),
    "llama-untied": ("LlamaForCausalLM", "LlamaConfig", dict(hidden_size=32, intermediate_size=64,
                                                             num_hidden_layers=2, num_attention_heads=4,
                                                             num_key_value_heads=2, vocab_size=101,
                                                             max_position_embeddings=64, tie_word_embeddings=False)),
    "t5": ("T5ForConditionalGeneration", "T5Config", dict(d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16,
                                                          vocab_size=101, decoder_start_token_id=0)),
    "bert": ("BertForMaskedLM", "BertConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                   num_attention_heads=2, vocab_size=101, max_position_embeddings=64)),
    # Checkpoints whose names transformers 5 renames (GPT-NeoX's embed_out is its lm_head) or converts as it loads
    # them (the per-expert weights transformers 5 itself saves, stacked into its fused experts).
    "gpt-neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(hidden_size=32, intermediate_size=64,
                                                             num_hidden_layers=2, num_attention_heads=4,
                                                             vocab_size=101, max_position_embeddings=64)),
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                                            num_attention_heads=4, num_key_value_heads=2,
                                                            vocab_size=101, num_local_experts=4,
                                                            num_experts_per_tok=2, max_position_embeddings=64)),
    "qwen2-moe": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(hidden_size=32, intermediate_size=48,
                                                                moe_intermediate_size=24,
                                                                shared_expert_intermediate_size=40,
                                                                num_hidden_layers=2, num_attention_heads=4,
                                                                num_key_value_heads=2, vocab_size=101, num_experts=4,
                                                                num_experts_per_tok=2, max_position_embeddings=64)),
    "qwen3-moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(hidden_size=32, intermediate_size=48,
                                                                moe_intermediate_size=24, num_hidden_layers=2,
                                                                num_attention_heads=4, num_key_value_heads=2,
                                                                head_dim=8, vocab_size=101, num_experts=4,
                                                                num_experts_per_tok=2, max_position_embeddings=64)),
}
RENAMED = ("gpt-neox", "mixtral", "qwen2-moe", "qwen3-moe")
LAYERS = {"gpt2": "n_layer", "llama": "num_hidden_layers", "llama-untied": "num_hidden_layers", "t5": "num_layers",
          **{a: "num_hidden_layers" for a in RENAMED},
          "bert": "num_hidden_layers"}


def _saved(tmp_path, arch, seed=0, **overrides):
    """A tiny model of arch saved by save_pretrained (bfloat16 on disk, to test the dtype rules), its class and the
    directory; a generating model with a generation_config.json of its own (beam search, 7 new tokens)."""
    cls_name, cfg_name, kw = ARCHS[arch]
    cls = getattr(transformers, cls_name)
    torch.manual_seed(seed)
    model = cls(getattr(transformers, cfg_name)(**{**kw, **overrides})).to(torch.bfloat16).eval()
    if model.can_generate():
        model.generation_config = transformers.GenerationConfig(max_new_tokens=7, num_beams=2, do_sample=False,
                                                                decoder_start_token_id=0 if arch == "t5" else None)
    d = tmp_path / arch
    model.save_pretrained(d)
    return cls, str(d)


def _ties(model):
    """The model's tied parameters: the sets of names that are one parameter."""
    groups = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), set()).add(n)
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


def _outputs(model, ids):
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            return model(input_ids=ids, decoder_input_ids=ids[:, :4]).logits
        return model(ids).logits


def _same_model(mine, theirs):
    """mine (sluice's) is theirs (transformers'): class, parameters (names, dtypes, values), ties, buffers, logits,
    generation_config and generate()."""
    assert type(mine) is type(theirs) and not mine.training
    want = dict(theirs.named_parameters(remove_duplicate=False))
    got = dict(mine.named_parameters(remove_duplicate=False))
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), (k, got[k].dtype, want[k].dtype)
    assert _ties(mine) == _ties(theirs)
    bufs = dict(theirs.named_buffers())
    for k, b in mine.named_buffers():
        assert b.dtype == bufs[k].dtype and torch.equal(b, bufs[k]), k
    ids = torch.randint(3, 101, (2, 6))
    assert torch.equal(_outputs(mine, ids), _outputs(theirs, ids))
    if theirs.can_generate():
        assert mine.generation_config.to_dict() == theirs.generation_config.to_dict()
        with torch.no_grad():
            out = theirs.generate(ids, attention_mask=torch.ones_like(ids))
            assert torch.equal(mine.generate(ids, attention_mask=torch.ones_like(ids)), out)
        return out


@pytest.mark.parametrize("dtype", [None, "float16", "bfloat16", "auto"])
@pytest.mark.parametrize("arch", ARCHS)
def test_from_pretrained_makes_the_model_transformers_makes(tmp_path, arch, dtype):
    cls, d = _saved(tmp_path, arch)
    kw = {} if dtype is None else {"dtype": dtype}
    out = _same_model(sluice.from_pretrained(d, device="cpu", **kw), cls.from_pretrained(d, **kw).eval())
    if out is not None and arch != "t5":  # generation_config.json's 7 new tokens, not generate()'s default 20
        assert out.shape[1] == 6 + 7


@pytest.mark.parametrize("arch", RENAMED)
def test_renamed_and_converted_checkpoints_load_by_transformers_rules(tmp_path, arch, monkeypatch):
    """What transformers 5 renames and converts as it loads: the checkpoint's own names are not the model's (the
    test would pass without a conversion otherwise); the fused tensors made in batches of a few sources at a time
    (here one each) are the same; renamed tensors are read into place, converted ones made of their sources."""
    import sluice.models as models
    cls, d = _saved(tmp_path, arch)
    stored = set(sluice.checkpoint._listing(d))
    theirs = cls.from_pretrained(d).eval()
    wanted = set(theirs.state_dict())
    if transformers.__version__.startswith("4."):
        pytest.skip("transformers 4 loads these checkpoints under their own names")
    assert stored - wanted, "the checkpoint's names are the model's: nothing to convert"
    rep = {}
    _same_model(sluice.from_pretrained(d, device="cpu", report=rep), theirs)
    assert rep["tensors"] == len(stored) and not rep["unexpected_keys"] and not rep["missing_keys"]
    reads = []
    real = models._load_from
    monkeypatch.setattr(models, "_load_from", lambda *a, **k: reads.append(k["keys"]) or real(*a, **k))
    monkeypatch.setattr(models, "_CONVERT_BATCH", 1)
    _same_model(sluice.from_pretrained(d, device="cpu"), theirs)
    assert sorted(k for r in reads for k in r) == sorted(stored)
    assert len(reads) == 1 if arch == "gpt-neox" else len(reads) > 2  # renames only: one read


def test_a_converted_tensor_the_model_does_not_fit_is_named(tmp_path):
    """Experts of another size than the config's: named before anything is read, as for a tensor read as is."""
    cls, d = _saved(tmp_path, "mixtral")
    if transformers.__version__.startswith("4."):
        pytest.skip("transformers 4 loads these checkpoints under their own names")
    with open(os.path.join(d, "config.json")) as f:
        doc = json.load(f)
    doc["intermediate_size"] = 40
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(doc, f)
    with pytest.raises(ValueError, match=r"tensor 'model.layers.0.mlp.experts.gate_up_proj' is BF16 \[4, 96, 32\]; "
                                         r"the model wants bfloat16 \[4, 80, 32\]"):
        sluice.from_pretrained(d, device="cpu")


@pytest.mark.parametrize("arch", ["gpt2", "llama", "t5"])
def test_without_generation_config_json_generate_is_transformers(tmp_path, arch):
    cls, d = _saved(tmp_path, arch)
    os.remove(os.path.join(d, "generation_config.json"))
    with open(os.path.join(d, "config.json")) as f:
        doc = json.load(f)
    doc["max_length"] = 11  # a generation setting in config.json, as older checkpoints have them
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(doc, f)
    _same_model(sluice.from_pretrained(d, device="cpu"), cls.from_pretrained(d).eval())


@pytest.mark.parametrize("arch", ["gpt2", "llama", "t5"])
def test_a_tied_config_whose_checkpoint_has_its_own_head_ties_as_transformers_does(tmp_path, arch):
    cls, d = _saved(tmp_path, arch, tie_word_embeddings=False)
    with open(os.path.join(d, "config.json")) as f:
        doc = json.load(f)
    doc["tie_word_embeddings"] = True
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(doc, f)
    theirs = cls.from_pretrained(d).eval()
    _same_model(sluice.from_pretrained(d, device="cpu"), theirs)
    if arch != "t5":  # transformers 4 keeps them tied (the embedding's values), 5 unties them (each its own)
        assert bool(_ties(theirs)) == transformers.__version__.startswith("4.")


def _edit_checkpoint(d, drop=(), add=None):
    from safetensors.torch import load_file, save_file
    path = os.path.join(d, "model.safetensors")
    state = {k: v for k, v in load_file(path).items() if k not in drop}
    state.update(add or {})
    save_file(state, path, metadata={"format": "pt"})


# Checkpoints and models that do not share all their tensors, and what transformers counts of each.
KEY_CASES = {
    "a config of fewer layers than its checkpoint": ("llama", {"num_hidden_layers": 1}, (), {}, None),
    "gpt2, fewer layers": ("gpt2", {"n_layer": 1}, (), {}, None),
    "t5, fewer layers": ("t5", {"num_layers": 1}, (), {}, None),
    "bert, fewer layers": ("bert", {"num_hidden_layers": 1}, (), {}, None),
    "a tensor no model has": ("llama", {}, (), {"extra.weight": torch.ones(2)}, None),
    "an old checkpoint's rotary inv_freq": ("llama", {}, (), {"model.layers.0.self_attn.rotary_emb.inv_freq":
                                                               torch.ones(4)}, None),
    "an old checkpoint's attention mask": ("gpt2", {}, (), {"transformer.h.0.attn.bias": torch.ones(1, 1, 4, 4)},
                                           None),
    "bert's old position_ids": ("bert", {}, (), {"bert.embeddings.position_ids": torch.arange(64)[None]}, None),
    "a missing tensor": ("llama", {}, ("model.layers.1.mlp.up_proj.weight",), {}, None),
    "a task's checkpoint into the base model": ("bert", {}, (), {}, "BertModel"),
    "t5's checkpoint into its encoder": ("t5", {}, (), {}, "T5EncoderModel"),
    "a base model's checkpoint into a task's model": ("bert", {}, ("cls.predictions.bias",), {},
                                                      "BertForSequenceClassification"),
}


@pytest.mark.parametrize("case", KEY_CASES)
def test_missing_and_unexpected_tensors_are_counted_as_transformers_counts_them(tmp_path, case):
    """strict=True refuses what transformers warns of (and loads anyway), naming each; strict=False loads as
    transformers does and reports the same names."""
    arch, config, drop, add, other = KEY_CASES[case]
    cls, d = _saved(tmp_path, arch)
    if config:
        with open(os.path.join(d, "config.json")) as f:
            doc = json.load(f)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({**doc, **config}, f)
    _edit_checkpoint(d, drop, {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in add.items()})
    cls = getattr(transformers, other) if other else cls
    theirs, info = cls.from_pretrained(d, output_loading_info=True)
    missing, unexpected = sorted(info["missing_keys"]), sorted(info["unexpected_keys"])
    if missing or unexpected:
        with pytest.raises(ValueError, match="sluice.from_pretrained: ") as e:
            sluice.from_pretrained(d, cls, device="cpu")
        assert all(f"'{k}'" in str(e.value) for k in missing + unexpected) and "config.json" in str(e.value)
    rep = {}
    mine = sluice.from_pretrained(d, cls, device="cpu", strict=not (missing or unexpected), report=rep)
    assert sorted(rep["missing_keys"]) == missing and sorted(rep["unexpected_keys"]) == unexpected
    want = dict(theirs.named_parameters())
    for k, p in mine.named_parameters():
        if k not in missing:
            assert p.dtype == want[k].dtype and torch.equal(p, want[k]), k


def test_transformers_older_than_sluice_mirrors_is_refused_in_one_sentence(tmp_path, monkeypatch):
    _, d = _saved(tmp_path, "gpt2")
    # The module sluice imports (transformers' lazy module may have replaced the one imported above)
    monkeypatch.setattr(importlib.import_module("transformers"), "__version__", "4.56.2")
    with pytest.raises(ImportError, match=r"^sluice.from_pretrained needs transformers 4.57 or later \(this is "
                                          r"4.56.2\): pip install -U transformers$"):
        sluice.from_pretrained(d, device="cpu")


FUZZ_VALUES = ["x", -1, 0, 2 ** 40, 2 ** 70, None, [1, 2], {"a": 1}, True, float("nan")]


@pytest.mark.parametrize("arch", ["gpt2", "llama", "t5", "bert"])
def test_odd_config_values_are_errors_naming_config_json_and_the_key(tmp_path, arch):
    """Each key of a valid config.json given odd values in turn (three of FUZZ_VALUES each, in rotation): the
    model loads, or the error is sluice's, naming config.json (and the key, where it is the value's fault: a
    checkpoint the config's sizes do not fit is named by its tensors)."""
    _, d = _saved(tmp_path, arch)
    path = os.path.join(d, "config.json")
    with open(path) as f:
        doc = json.load(f)
    for i, key in enumerate(sorted(doc)):
        for v in (FUZZ_VALUES[(3 * i + j) % len(FUZZ_VALUES)] for j in range(3)):
            with open(path, "w") as f:
                json.dump({**doc, key: v}, f)
            try:
                sluice.from_pretrained(d, device="cpu")
            except (sluice.SluiceError, ValueError, TypeError) as e:
                text = str(e)
                assert text.startswith(("sluice.from_pretrained: ", path)), (key, v, text)
                assert "config.json" in text, (key, v, text)
                if text.startswith(path):
                    assert f"{key}=" in text or f"{key} " in text or "failed on it" in text, (key, v, text)


class _Requests(torch.overrides.TorchFunctionMode):
    """The most elements any of torch's factories was asked for off the meta device, seen before it allocates."""
    def __init__(self):
        super().__init__()
        self.most = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in ("empty", "zeros", "ones", "full", "arange", "rand", "randn") \
                and torch.device(kwargs.get("device") or "cpu").type != "meta":
            self.most = max(self.most, func(*args, **{**kwargs, "device": "meta"}).numel())
        return func(*args, **kwargs)


SIZES = {"gpt2": ["n_embd", "n_positions", "vocab_size", "n_inner"],
         "llama": ["hidden_size", "intermediate_size", "max_position_embeddings", "vocab_size", "head_dim"],
         "t5": ["d_model", "d_ff", "d_kv", "vocab_size", "relative_attention_num_buckets"],
         "bert": ["hidden_size", "intermediate_size", "max_position_embeddings", "type_vocab_size", "vocab_size"]}


@pytest.mark.parametrize("arch", sorted(SIZES))
def test_a_config_of_huge_sizes_is_refused_before_its_memory_is_asked_for(tmp_path, arch):
    """A size of 2**40 in config.json is named (or loads) before any tensor of it is made: where the kernel grants memory it
    does not have (overcommit), a position_ids of 2**40 elements written by torch.arange kills the process (the
    H200 under transformers 5.17); the largest tensor asked for stays within the checkpoint's size."""
    _, d = _saved(tmp_path, arch)
    path = os.path.join(d, "config.json")
    with open(path) as f:
        doc = json.load(f)
    for key in SIZES[arch]:
        with open(path, "w") as f:
            json.dump({**doc, key: 2 ** 40}, f)
        seen, text = _Requests(), "loaded"
        with seen:
            try:
                sluice.from_pretrained(d, device="cpu")  # llama's rotary positions are computed, not stored
            except sluice.SluiceError as e:
                text = str(e)
                assert text.startswith(path) and f"{key}=" in text, (key, text)
        assert seen.most < 2 ** 30, (key, seen.most, text)


def test_a_generation_config_json_that_is_not_one_is_named(tmp_path):
    """Where transformers passes over a generation_config.json it cannot read (and generates otherwise), sluice
    names it: not JSON, not an object, values its GenerationConfig refuses, a directory, a FIFO, too large."""
    _, d = _saved(tmp_path, "gpt2")
    gen = os.path.join(d, "generation_config.json")
    for body, why in [(b"{", "not JSON"), (b"[1]", "not a JSON object"),
                      (b'{"max_new_tokens": -1}', "GenerationConfig refuses it"),
                      (b'{"watermarking_config": 5}', "GenerationConfig refuses it")]:
        with open(gen, "wb") as f:
            f.write(body)
        with pytest.raises(sluice.SluiceError, match=r"generation_config.json: .*" + why):
            sluice.from_pretrained(d, device="cpu")
    os.remove(gen)
    os.mkdir(gen)
    with pytest.raises(sluice.SluiceError, match=r"generation_config.json"):
        sluice.from_pretrained(d, device="cpu")
    os.rmdir(gen)
    os.mkfifo(gen)
    with pytest.raises(sluice.SluiceError, match=r"generation_config.json.*not a regular file"):
        sluice.from_pretrained(d, device="cpu")
    os.remove(gen)
    with open(gen, "wb") as f:
        f.truncate((16 << 20) + 1)
    with pytest.raises(sluice.SluiceError, match=r"more than the 16777216 a generation_config.json may hold"):
        sluice.from_pretrained(d, device="cpu")


def test_a_tensor_in_two_files_of_an_index_is_an_error_naming_both(tmp_path):
    """The same tensor in two shards of an index, other values in the one the index does not name: transformers
    reads each shard whole and its model has the last copy; sluice took the index's, silently another model.
    Now an error naming both files and the index."""
    from safetensors.torch import load_file, save_file
    src = _gpt2(4)
    src.save_pretrained(tmp_path / "m", max_shard_size="20KB")
    idx = json.load(open(tmp_path / "m" / "model.safetensors.index.json"))["weight_map"]
    files = sorted(set(idx.values()))
    name = next(k for k, f in idx.items() if f == files[0])
    last = load_file(str(tmp_path / "m" / files[-1]))
    save_file({**last, name: torch.zeros_like(load_file(str(tmp_path / "m" / files[0]))[name])},
              str(tmp_path / "m" / files[-1]), metadata={"format": "pt"})
    theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "m")
    assert not theirs.state_dict()[name].any()  # transformers' model has the zeros of the file it read last
    with pytest.raises(sluice.SluiceError) as e:
        sluice.from_pretrained(str(tmp_path / "m"), device="cpu")
    assert f"'{name}'" in str(e.value) and files[0] in str(e.value) and files[-1] in str(e.value), e.value
    assert "model.safetensors.index.json" in str(e.value)


def _device_maps(transformers):
    if importlib.util.find_spec("transformers.integrations.accelerate") is None or \
            transformers.__version__.startswith("4."):
        pytest.skip("device_map= needs transformers 5")
    pytest.importorskip("accelerate")


@pytest.mark.parametrize("arch", ["llama", "mixtral"])
def test_a_device_map_places_each_module_as_transformers_does(tmp_path, arch):
    """A dict of module names and "auto" (accelerate's, here over this machine's devices): every parameter on the
    device transformers' from_pretrained puts it, the same model and logits; one batched read a device."""
    _device_maps(transformers)
    cls, d = _saved(tmp_path, arch)
    gpus = torch.cuda.device_count()
    dev = (lambda i: i % gpus) if gpus else (lambda i: "cpu")
    maps = ["auto", {"model.embed_tokens": dev(0), "model.layers.0": dev(0), "model.layers.1": dev(1),
                     "model.norm": dev(1), "model.rotary_emb": dev(1), "lm_head": dev(1)}]
    for device_map in maps:
        theirs = cls.from_pretrained(d, device_map=device_map).eval()
        rep = {}
        mine = sluice.from_pretrained(d, device_map=device_map, report=rep)
        want = {n: p.device for n, p in theirs.named_parameters()}
        assert {n: p.device for n, p in mine.named_parameters()} == want
        assert {n: b.device for n, b in mine.named_buffers()} == {n: b.device for n, b in theirs.named_buffers()}
        ids = torch.randint(3, 101, (2, 6), device=next(iter(want.values())))
        with torch.no_grad():
            assert torch.equal(_outputs(mine, ids).cpu(), _outputs(theirs, ids).cpu())


def test_a_device_map_reads_each_device_once(tmp_path, monkeypatch):
    """Two modules' maps to devices: one read a device, each of exactly its tensors (CPU-only: both "cpu", one
    read)."""
    import sluice.models as models
    _device_maps(transformers)
    cls, d = _saved(tmp_path, "llama")
    gpus = torch.cuda.device_count()
    devs = ["cuda:0", "cuda:1"] if gpus >= 2 else ["cpu", "cpu"]
    reads, real = [], models._load_from
    monkeypatch.setattr(models, "_load_from", lambda *a, **k: reads.append((k["device"], len(k["keys"]))) or
                        real(*a, **k))
    device_map = {"model.embed_tokens": devs[0], "model.layers.0": devs[0], "": devs[1]}
    mine = sluice.from_pretrained(d, device_map=device_map)
    assert sorted({dev for dev, _ in reads}) == sorted(set(devs)) and len(reads) == len(set(devs))
    assert sum(n for _, n in reads) == len(sluice.checkpoint._listing(d))
    assert str(mine.model.layers[1].mlp.up_proj.weight.device) == devs[1]


def test_a_device_map_that_offloads_to_disk_is_refused(tmp_path):
    _device_maps(transformers)
    cls, d = _saved(tmp_path, "llama")
    with pytest.raises(ValueError, match="offloads to disk, which sluice does not"):
        sluice.from_pretrained(d, device_map={"model": "cpu", "lm_head": "disk"})
