"""Models ready on the GPU straight from a checkpoint.

from_pretrained: a transformers model from a directory (or an s3:// or http(s):// prefix) that holds its
config.json and safetensors weights.  The model is built with its parameters on the meta device (no memory, no
initialisation), the checkpoint is read as one batched read into one buffer on the device, and its tensors
become the parameters where they landed: no copy, tied weights one tensor.  load_model does the same for any
torch module built without weights (empty_weights() here, or accelerate's init_empty_weights()).
"""
import errno
import os
from contextlib import contextmanager, nullcontext

from ._lib import SluiceError, shown
from ._safetensors import DT, bad, is_remote, parse_json, read_small
from .checkpoint import _join, _listed, _listing, _named, load


@contextmanager
def empty_weights():
    """Modules built inside get their parameters on the meta device: no memory and no initialisation.  Their
    buffers are made as usual: a model computes some (rotary frequencies) that checkpoints do not hold.
    It swaps torch.nn.Module.register_parameter for the whole process while it is open, as accelerate's
    init_empty_weights does: build one model at a time, in one thread.  A module whose __init__ computes a buffer
    from its parameters gets the value computed from meta tensors: none (load_model refuses such a buffer where
    it is left on the meta device)."""
    import torch
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = _like(param, param.to("meta"))

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def _like(param, value):
    """A parameter like param (its class, its attributes and requires_grad) holding value."""
    p = type(param)(value, requires_grad=param.requires_grad)
    p.__dict__.update(vars(param))
    return p


_CONFIG_MAX = 16 << 20  # the most a config.json may hold
_MODEL_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _torch_dtype(torch, dtype):
    """dtype (a torch dtype, its name, or None) as a floating torch dtype, or None."""
    if isinstance(dtype, str) and isinstance(getattr(torch, dtype, None), torch.dtype):
        dtype = getattr(torch, dtype)
    if dtype is None or (isinstance(dtype, torch.dtype) and str(dtype).replace("torch.", "") in _MODEL_DTYPES):
        return dtype
    raise ValueError(f"sluice: dtype={dtype!r} is not a model's floating dtype (one of {', '.join(_MODEL_DTYPES)}, "
                     f"as torch.bfloat16 or 'bfloat16')")


def _key_map(names, table, prefix):
    """The checkpoint's name for each of the model's names, decided once for the whole checkpoint as transformers
    decides it: the same; or, where the model's names have the base model's prefix and the checkpoint's have
    none (a base model's checkpoint into a model with a head), without it; or, the other way round, with it."""
    p = prefix + "."
    if prefix and any(n.startswith(p) for n in names) and not any(k.startswith(p) for k in table):
        return lambda n: n[len(p):] if n.startswith(p) else n
    if prefix and any(k.startswith(p) for k in table) and not any(n.startswith(p) for n in names):
        return lambda n: p + n
    return lambda n: n


def _fits(torch, have, shape, t, want):
    """Whether a stored tensor of dtype have and shape can become the model's t (want: its dtype): the same
    shape, and the same dtype or two floating ones a conversion joins (not the packed float4)."""
    if have is None or tuple(shape) != tuple(t.shape):
        return False
    packed = getattr(torch, "float4_e2m1fn_x2", None)
    return have == want or (have.is_floating_point and want.is_floating_point and packed not in (have, want))


def _stored(torch, entry):
    """(torch dtype or None, shape as load delivers it) of a listing's (dtype, shape)."""
    dt, shape = entry
    name = DT[dt][1]
    return (getattr(torch, name, None) if name else None), ((*shape[:-1], shape[-1] // 2) if dt == "F4" and shape
                                                             else tuple(shape))


def _plan(torch, model, table, dtype, source):
    """(plan, missing, used): for each of the module's state_dict tensors (tied ones once, with every name), the
    tensor, its names, the checkpoint names that hold it and the dtype it is to have; the names the checkpoint
    lacks (parameters, and buffers on the meta device); the checkpoint names read.  A stored tensor that cannot
    become the module's is a ValueError naming it."""
    state = model.state_dict(keep_vars=True)
    key = _key_map(list(state), table, getattr(model, "base_model_prefix", "") or "")
    groups = {}
    for name, t in state.items():
        groups.setdefault(id(t), (t, []))[1].append(name)
    plan, missing, used = [], [], set()
    for t, names in groups.values():
        mapped = {n: key(n) for n in names}
        keys = list(dict.fromkeys(k for k in mapped.values() if k in table))
        want = dtype if dtype is not None and t.is_floating_point() else t.dtype
        for k in keys:
            if not _fits(torch, *_stored(torch, table[k]), t, want):
                raise ValueError(f"sluice.load_model: {_named(source)}: tensor '{k}' is {table[k][0]} "
                                 f"{list(table[k][1])}; the model wants {str(want).replace('torch.', '')} "
                                 f"{list(t.shape)}")
        used.update(keys)
        if not keys and (isinstance(t, torch.nn.Parameter) or t.device.type == "meta"):
            missing += names
        plan.append((t, names, keys, want, mapped))
    return plan, missing, used


def _computed(model, state_names):
    """{id: (buffer, names)} of the buffers the module made and checkpoints do not hold (non-persistent ones);
    one on the meta device is a ValueError: nothing can give it a value."""
    computed = {}
    for n, b in model.named_buffers(remove_duplicate=False):
        if n not in state_names:
            computed.setdefault(id(b), (b, []))[1].append(n)
    on_meta = [names[0] for b, names in computed.values() if b.device.type == "meta"]
    if on_meta:
        raise ValueError(f"sluice.load_model: buffers {', '.join(on_meta[:5])} are on the meta device and no "
                         f"checkpoint holds them: the model computes them, and they were made on the meta device "
                         f"(under torch.device('meta'), or from meta parameters in its __init__). Build the model "
                         f"with its buffers made (sluice.empty_weights() makes only parameters meta), or with its "
                         f"weights and load it with load_state_dict")
    return computed


def _set(model, name, value):
    """value under the module's name (dotted), in the table (parameters or buffers) that holds the name."""
    owner, _, leaf = name.rpartition(".")
    mod = model.get_submodule(owner) if owner else model
    (mod._parameters if leaf in mod._parameters else mod._buffers)[leaf] = value


def _fill(torch, model, t, names, value):
    """value into the module's tensor t, under names: a parameter keeps its object (an optimizer's reference,
    its class and attributes), its contents swapped for value's; a buffer is replaced."""
    if isinstance(t, torch.nn.Parameter):
        torch.utils.swap_tensors(t, _like(t, value))
        value = t
    for n in names:
        _set(model, n, value)


def load_model(model, source, device="cuda", dtype=None, strict=True, variant=None, report=None,
               process_group=None):
    """Loads a safetensors checkpoint (any source sluice.load takes) into a torch module and returns the module,
    its parameters and buffers on device.

    The module may be built without weights (empty_weights(), accelerate's init_empty_weights(), or
    torch.device("meta") for a module with no computed buffers).  Every tensor it needs is read as one batched
    read into one buffer on device, and each parameter's contents become a view of that buffer: no per-tensor
    copy, and no memory beyond the checkpoint's bytes where the dtypes match.  Each parameter stays the same
    object (an optimizer already made keeps working; its class and attributes stay).  As the parameters share
    one buffer, torch.save of a single one writes the whole buffer (save a .clone()), and safetensors'
    save_model refuses the model (sluice.save and transformers' save_pretrained save it).
    Names are the module's state_dict() names; a checkpoint of the base model (without base_model_prefix) or
    with the prefix where the module has none fits too, decided once for the whole checkpoint.  Tied parameters
    (one parameter under several names, as lm_head.weight and model.embed_tokens.weight) stay one parameter,
    read from the first name the checkpoint holds; where the checkpoint holds several of its names with
    different values, each name gets its own (report['untied']), as transformers does.  Buffers the module
    computed (not in the checkpoint) move to device and keep their dtype.  Shapes and dtypes are checked before
    anything is read, and each tensor read again after (a checkpoint rewritten in between fails with -ESTALE):
    a mismatch is an error naming the tensor.
    dtype: None keeps each tensor's dtype as the module has it; a floating torch dtype for every floating
    parameter and stored buffer.  A floating tensor stored in another dtype is converted on device after the
    read (one more buffer for it).
    strict: True, a ValueError naming every parameter (and every buffer on the meta device) the checkpoint lacks,
    and the checkpoint's tensors the module has no place for, before anything is read; False, the missing ones
    become zeros on device.  Tensors of the checkpoint the module has no place for are not read either way
    (report['unexpected_keys']).
    process_group: a torch.distributed group whose ranks all load the same model, each onto its own device: the
    group reads each byte once and all-gathers it (see sluice.load).
    report (a dict, or None) receives sluice.load's figures and missing_keys, unexpected_keys, untied."""
    import torch
    dtype = _torch_dtype(torch, dtype)
    device = torch.device(device)
    if callable(getattr(model, "tie_weights", None)):
        model.tie_weights()  # transformers' ties (accelerate's init_empty_weights makes each name its own)
    table = _listing(source, variant)
    plan, missing, used = _plan(torch, model, table, dtype, source)
    unexpected = [k for k in table if k not in used]
    if strict and missing:
        raise ValueError(
            f"sluice.load_model: {_named(source)} lacks {len(missing)} of the model's tensors: {_listed(missing, 20)}"
            + (f"; it holds {len(unexpected)} the model has no place for: {_listed(unexpected, 20)} (transformers renames "
               f"some checkpoints' names as it loads them; sluice does not: load those with transformers)"
               if unexpected else "") + " (strict=False makes the missing ones zeros)")
    computed = _computed(model, {n for _, names, *_ in plan for n in names})
    rep = {}
    got = load(source, device=str(device), keys=sorted(used), variant=variant, report=rep,
               process_group=process_group) if used else {}
    for t, names, keys, want, _ in plan:  # what was read against what was checked, before the model changes
        for k in keys:
            v = got.get(k)
            if v is None or not _fits(torch, v.dtype, v.shape, t, want):
                raise SluiceError(-errno.ESTALE, f"{_named(source)}: tensor '{k}' changed between its check and "
                                                 f"its read (now {None if v is None else v.dtype} "
                                                 f"{None if v is None else list(v.shape)})")
    untied = []
    for t, names, keys, want, key in plan:
        if not keys:
            _fill(torch, model, t, names, t.to(device, want) if t.device.type != "meta"
                  else torch.zeros(t.shape, dtype=want, device=device))
            continue
        values = {k: got[k].to(want) for k in keys}
        if len(keys) > 1 and not all(torch.equal(values[keys[0]], v) for v in values.values()):
            untied.append(names)  # tied in the model, different in the checkpoint: each name its own
            first = [n for n in names if key[n] == keys[0]]
            _fill(torch, model, t, first, values[keys[0]])
            for n in names:
                if n not in first:
                    v = values.get(key[n], values[keys[0]])
                    _set(model, n, _like(t, v) if isinstance(t, torch.nn.Parameter) else v)
        else:
            _fill(torch, model, t, names, values[keys[0]])
    for b, names in computed.values():
        for n in names:
            _set(model, n, b.to(device))
    if report is not None:
        report.update(rep, missing_keys=missing, unexpected_keys=unexpected, untied=untied)
    return model


def _config(source, model_class, kwargs):
    """The transformers config of the config.json in source (a directory, or an s3:// or http(s):// prefix; read
    through sluice)."""
    import transformers
    if not is_remote(source) and not os.path.isdir(source):
        raise ValueError(f"sluice.from_pretrained: {shown(source)} is not a directory (it takes the directory, or "
                         f"the s3:// or http(s):// prefix, that holds config.json and the checkpoint)")
    path = _join(source, "config.json")
    try:
        doc = parse_json(read_small(path, _CONFIG_MAX, "a config.json"))
    except ValueError as e:
        raise bad(path, f"not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise bad(path, "not a JSON object")
    config_class = getattr(model_class, "config_class", None)
    if config_class is None:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        kind = doc.get("model_type")
        if not isinstance(kind, str) or kind not in CONFIG_MAPPING:
            raise bad(path, f"model_type {kind!r} is not one transformers {transformers.__version__} knows "
                            f"(pass model_class=)")
        config_class = CONFIG_MAPPING[kind]
    return config_class.from_dict(doc, **kwargs)


def _keep_fp32(torch, model, dtype):
    """The parameters transformers keeps in float32 at this dtype (its _keep_in_fp32_modules: T5's wo in float16)
    made float32, still on the meta device."""
    plan = model._get_dtype_plan(dtype) if callable(getattr(model, "_get_dtype_plan", None)) else {}
    for name, p in model.named_parameters():
        kept = next((m for m in plan if f".{m}." in f".{name}."), None)
        if kept is not None and p.is_meta and p.is_floating_point():
            torch.utils.swap_tensors(p, _like(p, p.to(plan[kept])))


def from_pretrained(source, model_class=None, device="cuda", dtype=None, strict=True, variant=None, report=None,
                    process_group=None, **kwargs):
    """A transformers model ready on device (for its first forward, in eval mode) from source: a directory, or
    an s3:// or http(s):// prefix ending in /, that holds config.json and the safetensors checkpoint (its index,
    else its files, as sluice.load finds them).

    model_class: the transformers class to build (LlamaForCausalLM); None, the first of config.json's
    architectures.  dtype: of the floating parameters; None or "auto", config.json's dtype, else the
    checkpoint's (the modules transformers keeps in float32 stay float32).  kwargs go to the config, as
    transformers' from_pretrained passes them (attn_implementation=).
    The model is built with its parameters on the meta device and its buffers made as usual, then load_model
    reads the checkpoint into place (see it for strict, variant, report and process_group).  Not handled: remote
    code, quantized checkpoints, device maps over several devices, and the checkpoints whose names transformers
    renames as it loads them (old checkpoints, GPT-NeoX's embed_out, some fused experts): load those with
    transformers."""
    import torch
    import transformers
    source = os.fspath(source)
    if model_class is not None and not (isinstance(model_class, type) and issubclass(model_class, torch.nn.Module)):
        raise TypeError(f"sluice.from_pretrained: model_class={model_class!r} is not a torch.nn.Module class")
    config = _config(source, model_class, kwargs)
    if model_class is None:
        arch = (getattr(config, "architectures", None) or [None])[0]
        found = getattr(transformers, arch, None) if isinstance(arch, str) else None
        if not (isinstance(found, type) and issubclass(found, transformers.PreTrainedModel)):
            raise ValueError(f"sluice.from_pretrained: {_named(source)}: config.json names no model class "
                             f"transformers has ({arch!r}): pass model_class=")
        model_class = found
    if dtype in (None, "auto"):
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if dtype is None:
            dtype = next((DT[dt][1] for dt, _ in _listing(source, variant).values()
                          if DT[dt][1] in _MODEL_DTYPES), "float32")
    dtype = _torch_dtype(torch, dtype)
    try:  # transformers' switch for its weights' initialisation: no use on weights the checkpoint replaces
        from transformers.initialization import no_init_weights
    except ImportError:
        no_init_weights = nullcontext
    with empty_weights(), no_init_weights():
        build = getattr(model_class, "_from_config", None)
        model = build(config, dtype=dtype) if build else model_class(config)
    _keep_fp32(torch, model, dtype)
    load_model(model, source, device=device, strict=strict, variant=variant, report=report,
               process_group=process_group)
    return model.eval()
