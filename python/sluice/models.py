"""Models ready on the GPU straight from a checkpoint.

from_pretrained: a transformers model from a directory (or an s3:// or http(s):// prefix) that holds its
config.json and safetensors weights.  The model is built with its parameters on the meta device (no memory, no
initialisation), the checkpoint is read as one batched read into one buffer on the device, and its tensors
become the parameters where they landed: no copy, tied weights one tensor.  load_model does the same for any
torch module built without weights (empty_weights() here, or accelerate's init_empty_weights()).
"""
import glob
import os
from contextlib import contextmanager, nullcontext

from ._safetensors import DT, is_url, parse_json, read_small
from .checkpoint import _join, _listing, _named, load


@contextmanager
def empty_weights():
    """Modules built inside get their parameters on the meta device: no memory and no initialisation.  Their
    buffers are made as usual: a model computes some (rotary frequencies) that checkpoints do not hold.
    (It swaps torch.nn.Module.register_parameter while it is open, as accelerate's init_empty_weights does:
    build one model at a time.)"""
    import torch
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            meta = type(param)(param.to("meta"), requires_grad=param.requires_grad)
            meta.__dict__.update(vars(param))
            module._parameters[name] = meta

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def _torch_dtype(torch, dtype, what):
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and isinstance(getattr(torch, dtype, None), torch.dtype):
        return getattr(torch, dtype)
    raise ValueError(f"sluice: {what}={dtype!r} is not a torch dtype (as torch.bfloat16 or 'bfloat16')")


def _checkpoint_key(name, table, prefix):
    """The checkpoint's name for the model's tensor name: the same, or with the base model's prefix taken off or
    put on (a base model's checkpoint loaded into a model with a head, and the other way round)."""
    if name in table:
        return name
    if prefix and name.startswith(prefix + ".") and name[len(prefix) + 1:] in table:
        return name[len(prefix) + 1:]
    if prefix and f"{prefix}.{name}" in table:
        return f"{prefix}.{name}"
    return None


def _wanted(torch, t, dtype):
    """The dtype the model's tensor t is to have: its own, or dtype for a floating one."""
    return dtype if dtype is not None and t.is_floating_point() else t.dtype


def _check_fits(torch, key, entry, t, want, source):
    """A ValueError naming key where the checkpoint's tensor cannot become the model's t (want: its dtype)."""
    dt, shape = entry
    name = DT[dt][1]
    have = getattr(torch, name, None) if name else None
    if dt == "F4" and shape:
        shape = (*shape[:-1], shape[-1] // 2)
    if have is None or tuple(shape) != tuple(t.shape) or (
            have != want and not (have.is_floating_point and want.is_floating_point)):
        raise ValueError(f"sluice.load_model: {_named(source)}: tensor '{key}' is {dt} {list(entry[1])}; the model "
                         f"wants {str(want).replace('torch.', '')} {list(t.shape)}")


def _put(model, names, value, param):
    """value under each of names (dotted): one parameter made of it, shared by the names, where param (the
    module's tensor it replaces) is one; else a buffer."""
    import torch
    if param is not None:
        value = torch.nn.Parameter(value, requires_grad=param.requires_grad)
    for name in names:
        owner, _, leaf = name.rpartition(".")
        mod = model.get_submodule(owner) if owner else model
        (mod._parameters if param is not None else mod._buffers)[leaf] = value


def load_model(model, source, device="cuda", dtype=None, strict=True, variant=None, report=None,
               process_group=None):
    """Loads a safetensors checkpoint (any source sluice.load takes) into a torch module and returns the module,
    its parameters and buffers on device.

    The module may be built without weights (empty_weights(), accelerate's init_empty_weights(), or
    torch.device("meta") for a module with no computed buffers).  Every tensor it needs is read as one batched
    read into one buffer on device, and each parameter becomes a view of that buffer: no per-tensor copy, and no
    memory beyond the checkpoint's bytes where the dtypes match.  Names are the module's state_dict() names; a
    checkpoint of the base model (no base_model_prefix) or with one more prefix fits too.  Tied parameters (one
    parameter under several names, as lm_head.weight and model.embed_tokens.weight) stay one parameter, read
    from the first name the checkpoint holds; where the checkpoint holds several of its names with different
    values, each name gets its own (report['untied']), as transformers does.  Buffers the module computed (not
    in the checkpoint) move to device.  Shapes and dtypes are checked before anything is read: a mismatch is a
    ValueError naming the tensor.
    dtype: None keeps each tensor's dtype as the module has it; a torch dtype for every floating tensor.  A
    floating tensor stored in another dtype is converted on device after the read (one more buffer for it).
    strict: True, a ValueError naming every parameter (and every buffer on the meta device) the checkpoint lacks,
    before anything is read; False, those become zeros on device.  Tensors of the checkpoint the module has no
    place for are not read either way (report['unexpected_keys']).
    process_group: a torch.distributed group whose ranks all load the same model, each onto its own device: the
    group reads each byte once and all-gathers it (see sluice.load).
    report (a dict, or None) receives sluice.load's figures and missing_keys, unexpected_keys, untied."""
    import torch
    dtype = _torch_dtype(torch, dtype, "dtype")
    device = torch.device(device)
    if callable(getattr(model, "tie_weights", None)):
        model.tie_weights()  # transformers' ties (accelerate's init_empty_weights makes each name its own)
    table = _listing(source, variant)
    prefix = getattr(model, "base_model_prefix", "") or ""
    state = model.state_dict(keep_vars=True)
    groups = {}  # the module's tensors, each with every name it has (tied ones have several)
    for name, t in state.items():
        groups.setdefault(id(t), (t, []))[1].append(name)
    plan, missing, used = [], [], set()
    for t, names in groups.values():
        keys = [k for k in (_checkpoint_key(n, table, prefix) for n in names) if k is not None]
        want = _wanted(torch, t, dtype)
        for k in keys:
            _check_fits(torch, k, table[k], t, want, source)
        used.update(keys)
        if not keys and (isinstance(t, torch.nn.Parameter) or t.device.type == "meta"):
            missing += names
        plan.append((t, names, list(dict.fromkeys(keys)), want))
    if strict and missing:
        raise ValueError(f"sluice.load_model: {_named(source)} lacks {len(missing)} of the model's tensors: "
                         + ", ".join(repr(m) for m in missing[:20]) + (" and more" if len(missing) > 20 else "")
                         + " (strict=False makes them zeros)")
    computed = {}  # buffers the module made and checkpoints do not hold
    for n, b in model.named_buffers(remove_duplicate=False):
        if n not in state:
            computed.setdefault(id(b), (b, []))[1].append(n)
    on_meta = [names[0] for b, names in computed.values() if b.device.type == "meta"]
    if on_meta:
        raise ValueError(f"sluice.load_model: buffers {', '.join(on_meta[:5])} are on the meta device and no "
                         f"checkpoint holds them (the model computes them): build it with its buffers made, as "
                         f"sluice.empty_weights() or accelerate's init_empty_weights(include_buffers=False) do")
    rep = {}
    got = load(source, device=str(device), keys=[glob.escape(k) for k in sorted(used)], variant=variant,
               report=rep, process_group=process_group) if used else {}
    untied = []
    for t, names, keys, want in plan:
        param = t if isinstance(t, torch.nn.Parameter) else None
        if not keys:
            _put(model, names, t.to(device, want) if t.device.type != "meta"
                 else torch.zeros(t.shape, dtype=want, device=device), param)
            continue
        values = {k: got[k].to(want) for k in keys}
        if len(keys) > 1 and not all(torch.equal(values[keys[0]], v) for v in values.values()):
            untied.append(names)  # tied in the model, different in the checkpoint: each name its own
            for n in names:
                _put(model, [n], values[_checkpoint_key(n, table, prefix) or keys[0]], param)
        else:
            _put(model, names, values[keys[0]], param)
    for b, names in computed.values():
        _put(model, names, b.to(device), None)
    if report is not None:
        report.update(rep, missing_keys=missing, unexpected_keys=[k for k in table if k not in used], untied=untied)
    return model


def _config(source, model_class, kwargs):
    """The transformers config of source's config.json (read through sluice: local, s3:// or http(s)://)."""
    import transformers
    path = _join(source, "config.json") if is_url(source) or os.path.isdir(source) else source
    doc = parse_json(read_small(path))
    if not isinstance(doc, dict):
        raise ValueError(f"sluice.from_pretrained: {path}: not a JSON object")
    config_class = getattr(model_class, "config_class", None)
    if config_class is None:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        if doc.get("model_type") not in CONFIG_MAPPING:
            raise ValueError(f"sluice.from_pretrained: {path}: model_type {doc.get('model_type')!r} is not one "
                             f"transformers {transformers.__version__} knows (pass model_class=)")
        config_class = CONFIG_MAPPING[doc["model_type"]]
    return config_class.from_dict(doc, **kwargs)


def from_pretrained(source, model_class=None, device="cuda", dtype=None, strict=True, variant=None, report=None,
                    process_group=None, **kwargs):
    """A transformers model ready on device (for its first forward, in eval mode) from source: a directory, or
    an s3:// or http(s):// prefix ending in /, that holds config.json and the safetensors checkpoint (its index,
    else its files, as sluice.load finds them).

    model_class: the transformers class to build (LlamaForCausalLM); None, the first of config.json's
    architectures.  dtype: of the floating parameters; None or "auto", config.json's dtype, else the
    checkpoint's.  kwargs go to the config, as transformers' from_pretrained passes them (attn_implementation=).
    The model is built with its parameters on the meta device and its buffers made as usual, then load_model
    reads the checkpoint into place (see it for strict, variant, report and process_group).  Not handled: remote code,
    quantized checkpoints, device maps over several devices, and transformers' renaming of old checkpoints' keys."""
    import torch
    import transformers
    source = os.fspath(source)
    config = _config(source, model_class, kwargs)
    if model_class is None:
        arch = (getattr(config, "architectures", None) or [None])[0]
        model_class = getattr(transformers, arch, None) if arch else None
        if model_class is None:
            raise ValueError(f"sluice.from_pretrained: {_named(source)}: config.json names no architecture "
                             f"transformers has ({arch!r}): pass model_class=")
    if dtype in (None, "auto"):
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if dtype is None:
            floats = [DT[dt][1] for dt, _ in _listing(source, variant).values() if dt.startswith(("F", "BF"))]
            dtype = floats[0] if floats else None
    dtype = _torch_dtype(torch, dtype, "dtype")
    try:  # transformers' switch for its weights' initialisation: no use on weights the checkpoint replaces
        from transformers.initialization import no_init_weights
    except ImportError:
        no_init_weights = nullcontext
    with empty_weights(), no_init_weights():
        build = getattr(model_class, "_from_config", None)
        model = build(config, dtype=dtype) if build else model_class(config)
    load_model(model, source, device=device, strict=strict, variant=variant, report=report,
               process_group=process_group)
    return model.eval()
