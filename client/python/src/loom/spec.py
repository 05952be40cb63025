"""Job specs as people write them: a dict or a YAML file whose keys are the proto's field names.

There is one schema, loom.v1.JobSpec: keys are its fields' JSON names (globalBatchTokens) or
proto names (global_batch_tokens), as loomctl accepts them. The tree is checked against the
descriptor first, so that an unknown key or a value of the wrong shape is reported with its
path ("spec.model.prest: unknown field ..."), then converted by json_format.ParseDict.

Conveniences that loomctl has too: an empty value (`auto:`) of a message field is the empty
message; an empty value of a scalar is left unset; numbers given for string fields (and `env`
values) are taken as their text; relative data.path, data.val_path and checkpoint.dir of a YAML
file are resolved against the file's folder.
"""

from __future__ import annotations

import difflib
import os
import re
from typing import Any, Mapping, Union

import yaml
from google.protobuf import descriptor as _descriptor
from google.protobuf import json_format

from loom.errors import InvalidArgument, NotFound
from loom.v1 import job_pb2

SpecLike = Union[job_pb2.JobSpec, Mapping[str, Any], str, "os.PathLike[str]"]

_FD = _descriptor.FieldDescriptor
_PARSE_PATH = re.compile(r"Failed to parse (\w+) field")
MAX_SPEC_BYTES = 4 << 20


def _find_field(message: _descriptor.Descriptor, key: str):
    field = message.fields_by_name.get(key)
    if field is not None:
        return field
    for field in message.fields:
        if field.json_name == key:
            return field
    return None


def _unknown_key(message: _descriptor.Descriptor, key: str, path: str) -> InvalidArgument:
    names = [f.json_name for f in message.fields]
    close = difflib.get_close_matches(key, names + [f.name for f in message.fields], n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    field = f"{path}.{key}"
    return InvalidArgument(
        f"{field}: unknown field of {message.full_name}; {hint}known fields: {', '.join(names)}",
        field=field)


def _scalar_text(value: Any, path: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise InvalidArgument(f"{path}: expected a string, got {value!r}", field=path)


def _normalize_message(value: Any, message: _descriptor.Descriptor, path: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{path}: expected a mapping of {message.full_name}, got {value!r}",
                              field=path)
    out = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise InvalidArgument(f"{path}: keys must be field names, got {key!r}", field=path)
        field = _find_field(message, key)
        if field is None:
            raise _unknown_key(message, key, path)
        normalized = _normalize_field(item, field, f"{path}.{key}")
        if normalized is not None:
            out[key] = normalized
    return out


def _normalize_single(value: Any, field: _FD, path: str) -> Any:
    if field.type == _FD.TYPE_MESSAGE:
        return _normalize_message(value, field.message_type, path)
    if field.type == _FD.TYPE_STRING:
        return _scalar_text(value, path)
    return value


def _normalize_field(value: Any, field: _FD, path: str) -> Any:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise InvalidArgument(f"{path}: expected a mapping, got {value!r}", field=path)
        value_field = field.message_type.fields_by_name["value"]
        return {
            str(k): _normalize_single(v, value_field, f'{path}["{k}"]')
            for k, v in value.items()
        }
    if field.label == _FD.LABEL_REPEATED:
        if value is None:
            return None
        if not isinstance(value, list):
            raise InvalidArgument(f"{path}: expected a list, got {value!r}", field=path)
        return [_normalize_single(v, field, f"{path}[{i}]") for i, v in enumerate(value)]
    if value is None:
        return {} if field.type == _FD.TYPE_MESSAGE else None
    return _normalize_single(value, field, path)


def spec_from_dict(spec: Mapping[str, Any]) -> job_pb2.JobSpec:
    """Converts a dict (keys: JobSpec's JSON or proto field names) to a JobSpec.

    Raises InvalidArgument whose `field` names the offending key ("spec.model.prest").
    """
    normalized = _normalize_message(spec, job_pb2.JobSpec.DESCRIPTOR, "spec")
    try:
        return json_format.ParseDict(normalized, job_pb2.JobSpec())
    except json_format.ParseError as e:
        # "Failed to parse train field: Failed to parse steps field: ..." names the path.
        field = ".".join(["spec"] + _PARSE_PATH.findall(str(e)))
        raise InvalidArgument(f"{field}: {e}", field=field) from None


def spec_from_yaml(text: str, base_dir: str = "") -> job_pb2.JobSpec:
    """Converts YAML text to a JobSpec; relative paths in it are resolved against `base_dir`
    when it is not empty. Raises InvalidArgument for malformed YAML or a bad key or value."""
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InvalidArgument(f"spec: not valid YAML: {e}", field="spec") from None
    spec = spec_from_dict(tree if tree is not None else {})
    if base_dir:
        for holder, name in ((spec.data, "path"), (spec.data, "val_path"),
                             (spec.checkpoint, "dir")):
            value = getattr(holder, name)
            if value and not os.path.isabs(value):
                setattr(holder, name, os.path.normpath(os.path.join(base_dir, value)))
    return spec


def load_spec(spec: SpecLike) -> job_pb2.JobSpec:
    """A JobSpec from a JobSpec (copied), a dict, or the path of a YAML file.

    Raises NotFound for a file that cannot be read, InvalidArgument for a bad spec.
    """
    if isinstance(spec, job_pb2.JobSpec):
        copy = job_pb2.JobSpec()
        copy.CopyFrom(spec)
        return copy
    if isinstance(spec, Mapping):
        return spec_from_dict(spec)
    if isinstance(spec, (str, os.PathLike)):
        path = os.fspath(spec)
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_SPEC_BYTES + 1)
        except OSError as e:
            raise NotFound(f"cannot read job spec '{path}': {e.strerror}; pass an existing YAML "
                           "file, or a dict") from None
        if len(data) > MAX_SPEC_BYTES:
            raise InvalidArgument(f"spec: '{path}' is over {MAX_SPEC_BYTES} bytes", field="spec")
        return spec_from_yaml(data.decode("utf-8", errors="replace"),
                              os.path.dirname(os.path.abspath(path)))
    raise InvalidArgument(
        f"spec: expected a dict, a YAML file path or a loom.v1.JobSpec, got {type(spec).__name__}",
        field="spec")
