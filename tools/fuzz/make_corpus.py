#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets: tools/fuzz/corpus/<reader>/ (every file < 4 KiB).

    pip install safetensors numpy           # the reference safetensors library
    python3 tools/fuzz/make_corpus.py       # all readers; runs bazel for :checkpoint_seed
    python3 tools/fuzz/make_corpus.py idx   # one reader

Seed names say what the readers must do with them: valid_* reads, invalid_* is refused with a
Status, edge_* is either (tests/fuzz/corpus_test.cc checks this). A reference script: the
generated files are committed, and nothing in the build or the tests runs Python.

Valid safetensors files come from the reference library (safetensors.numpy.save, and
safetensors.serialize for bf16); the invalid ones are written byte by byte below, each named
after what is wrong with it. Valid checkpoints come from RunState::Save
(//tools/fuzz:checkpoint_seed), the invalid ones are edits of them; rerun after a change of the
checkpoint format. IDX, token shard and text seeds are written here directly. The output is
deterministic (gzip mtime 0).
"""

import ctypes
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

import numpy as np
import safetensors
import safetensors.numpy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tools", "fuzz", "corpus")
MAX_BYTES = 4096


def write(reader, name, data):
    assert len(data) < MAX_BYTES, (reader, name, len(data))
    with open(os.path.join(CORPUS, reader, name), "wb") as f:
        f.write(data)


# ---- safetensors layout helpers (our own writer, for the invalid files) -------------------------


def split(data):
    """(header dict, data buffer) of a well-formed file."""
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def join(header_text, buffer, pad=b" "):
    """8-byte length + header text padded to a multiple of 8 with `pad` + buffer."""
    text = header_text.encode() if isinstance(header_text, str) else header_text
    text += pad * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + buffer


def rebuild(header, buffer, tensors_order=None):
    """Re-lays out the tensors of `header` (with data from `buffer`) contiguously."""
    meta = header.get("__metadata__")
    names = tensors_order or sorted(k for k in header if k != "__metadata__")
    out_header = {} if meta is None else {"__metadata__": meta}
    out = b""
    for name in names:
        entry = dict(header[name])
        begin, end = entry["data_offsets"]
        chunk = buffer[begin:end]
        entry["data_offsets"] = [len(out), len(out) + len(chunk)]
        out += chunk
        out_header[name] = entry
    return join(json.dumps(out_header, separators=(",", ":")), out)


def safetensors_seeds():
    r = "safetensors"
    f32 = np.array([[1.0, -2.0], [3.5, 0.25]], dtype=np.float32)
    write(r, "valid_f32.safetensors", safetensors.numpy.save({"w": f32}, metadata={"format": "pt"}))
    write(
        r,
        "valid_dtypes.safetensors",
        safetensors.numpy.save(
            {
                "f64": np.array([1.0, np.inf, -0.0], dtype=np.float64),
                "f16": np.array([[1, 2], [65504, -np.inf]], dtype=np.float16),
                "i32": np.array([-1, 2147483647], dtype=np.int32),
                "i64": np.array([-9223372036854775808], dtype=np.int64),
                "u8": np.array([0, 1, 254, 255], dtype=np.uint8),
                "bool": np.array([True, False, True]),
            }
        ),
    )
    bf16 = ctypes.create_string_buffer(b"\x80\x3f\x00\x40\xc0\x7f\x80\xff", 8)  # 1, 2, nan, -inf
    spec = safetensors.TensorSpec(
        dtype="bfloat16", shape=[2, 2], data_ptr=ctypes.addressof(bf16), data_len=8
    )
    write(r, "valid_bf16.safetensors", safetensors.serialize({"b": spec}, None))
    # Both FP8 formats, every code (NaN codes too): the reference writes the bytes as they are.
    codes = ctypes.create_string_buffer(bytes(range(256)), 256)
    fp8 = {
        name: safetensors.TensorSpec(
            dtype=dtype, shape=shape, data_ptr=ctypes.addressof(codes), data_len=256
        )
        for name, dtype, shape in (("e4m3", "float8_e4m3fn", [16, 16]), ("e5m2", "float8_e5m2", [256]))
    }
    write(r, "valid_fp8.safetensors", safetensors.serialize(fp8, None))
    write(r, "valid_no_tensors.safetensors", safetensors.numpy.save({}))
    write(r, "valid_metadata_only.safetensors", safetensors.numpy.save({}, metadata={"k": "v"}))
    write(
        r,
        "valid_scalar_and_empty.safetensors",
        safetensors.numpy.save(
            {
                "scalar": np.array(3.0, dtype=np.float32),
                "empty": np.zeros([0], dtype=np.float32),
                "empty2": np.zeros([2, 0, 3], dtype=np.int64),
            }
        ),
    )
    # A StateDict: scalars in __metadata__ (LoadStateDict), one of them not a number.
    sd_tensors = {"state.0.exp_avg": np.array([0.5, -0.5], dtype=np.float32)}
    write(
        r,
        "valid_state_dict.safetensors",
        safetensors.numpy.save(sd_tensors, metadata={"scalar:step": "3", "scalar:lr": "0.001"}),
    )
    write(
        r,
        "invalid_scalar_not_a_number.safetensors",
        safetensors.numpy.save(sd_tensors, metadata={"scalar:step": "three"}),
    )

    # Item 6 of the issue: the files the reader must reject.
    two = safetensors.numpy.save(
        {"a": np.arange(3, dtype=np.float32), "b": np.arange(2, dtype=np.int32)}
    )
    header, buffer = split(two)
    (n,) = struct.unpack("<Q", two[:8])
    assert two[8 + n - 1 : 8 + n] == b" ", "need a space-padded header for the one-byte-short file"
    write(r, "invalid_header_length_one_short.safetensors", struct.pack("<Q", n - 1) + two[8:])
    write(
        r,
        "invalid_duplicate_name.safetensors",
        join(
            '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
            '"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}',
            bytes(range(16)),
        ),
    )
    write(
        r,
        "invalid_gap.safetensors",
        join(
            '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
            '"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}}',
            bytes(range(16)),
        ),
    )
    write(r, "invalid_trailing_bytes.safetensors", two + b"\x00\x01\x02\x03")
    write(
        r,
        "invalid_nul_padding.safetensors",
        join('{"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}', b"abc", pad=b"\0"),
    )
    write(r, "invalid_truncated.safetensors", two[:-3])
    write(r, "invalid_truncated_length.safetensors", two[:5])
    write(r, "invalid_huge_header_length.safetensors", struct.pack("<Q", 2**64 - 1) + two[8:])
    write(
        r, "invalid_header_length_over_limit.safetensors", struct.pack("<Q", 100_000_001) + two[8:]
    )
    write(r, "invalid_header_length_zero.safetensors", struct.pack("<Q", 0) + two[8:])

    # More ways to be wrong.
    def one(entry, data, meta=None):
        h = {"x": entry}
        if meta is not None:
            h["__metadata__"] = meta
        return join(json.dumps(h, separators=(",", ":")), data)

    write(
        r,
        "invalid_overlap.safetensors",
        join(
            '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
            '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}',
            bytes(12),
        ),
    )
    write(
        r,
        "invalid_unknown_dtype.safetensors",
        one({"dtype": "F8_E8M0", "shape": [2], "data_offsets": [0, 2]}, b"\x01\x02"),
    )
    write(
        r,
        "invalid_shape_needs_more.safetensors",
        one({"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}, bytes(12)),
    )
    write(
        r,
        "invalid_negative_dim.safetensors",
        one({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}, bytes(4)),
    )
    write(
        r,
        "invalid_shape_overflow.safetensors",
        one({"dtype": "F64", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}, bytes(8)),
    )
    write(
        r,
        "invalid_offsets_reversed.safetensors",
        one({"dtype": "U8", "shape": [0], "data_offsets": [4, 0]}, bytes(4)),
    )
    write(
        r,
        "invalid_bool_value.safetensors",
        one({"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}, b"\x01\x02"),
    )
    write(r, "invalid_not_object.safetensors", join("[1,2,3]", b""))
    write(r, "invalid_json.safetensors", join('{"x":{"dtype":"F32",', b""))
    deep = '{"__metadata__":' + "[" * 40 + "]" * 40 + "}"
    write(r, "invalid_deep_nesting.safetensors", join(deep, b""))
    write(r, "invalid_metadata_not_string.safetensors", join('{"__metadata__":{"k":1}}', b""))
    bad_name = b'{"\xff":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}'
    write(r, "invalid_name_bad_utf8.safetensors", join(bad_name, b""))
    write(r, "invalid_header_trailing_text.safetensors", join("{} {}", b""))
    # The checksums of tapegrad's writer ("crc32:<name>" in __metadata__): right, then wrong.
    data = struct.pack("<2f", 1.5, -2.0)
    entry = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    write(r, "valid_crc32.safetensors", one(entry, data, {"crc32:x": "%08x" % zlib.crc32(data)}))
    write(r, "invalid_crc32_mismatch.safetensors", one(entry, data, {"crc32:x": "00000000"}))
    write(r, "invalid_crc32_unknown_tensor.safetensors", one(entry, data, {"crc32:y": "00000000"}))
    write(r, "invalid_crc32_not_hex.safetensors", one(entry, data, {"crc32:x": "xyz"}))


# ---- checkpoints ---------------------------------------------------------------------------------


def checkpoint_seeds():
    r = "checkpoint"
    out = os.path.join(CORPUS, r)
    subprocess.run(
        ["bazel", "run", "//tools/fuzz:checkpoint_seed", "--", out], cwd=ROOT, check=True
    )
    for name in os.listdir(out):
        with open(os.path.join(out, name), "rb") as f:
            assert len(f.read()) < MAX_BYTES, name

    def load(name):
        with open(os.path.join(out, name), "rb") as f:
            return split(f.read())

    def edit(base, name, meta=None, drop_meta=(), tensors=None, drop=(), add=None,
             keep_header_crc=False):
        header, buffer = load(base)
        m = header["__metadata__"]
        # The whole-header checksum would refuse every edit; without it the file reads as one
        # written before that checksum existed, so the checks of each value are what refuse it.
        if not keep_header_crc:
            m.pop("crc32:__metadata__", None)
        m.update(meta or {})
        for k in drop_meta:
            m.pop(k, None)
        for t, changes in (tensors or {}).items():
            header[t].update(changes)
        for t in drop:
            del header[t]
        if add is not None:
            tname, dtype, shape, data = add
            offsets = [len(buffer), len(buffer) + len(data)]
            header[tname] = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
            buffer += data
        write(r, name, rebuild(header, buffer))

    adam, sgd = "valid_f16_adamw_step2.safetensors", "valid_f32_sgd_step2.safetensors"
    # Without checksums (as another writer's file): mutations of the tensor data get past the
    # CRC check into load_state_dict.
    for base in (adam, sgd):
        header, _ = load(base)
        crcs = [k for k in header["__metadata__"] if k.startswith("crc32:")]
        edit(base, base.replace("valid_", "valid_no_crc_"), drop_meta=crcs)
    edit(adam, "valid_override_lr.safetensors", meta={"setting.lr": "0.02"})
    # With the whole-header checksum kept, any changed value is refused by it.
    edit(adam, "invalid_header_crc.safetensors", meta={"scalar:schedule.base_lrs.0": "1"},
         keep_header_crc=True)
    edit(adam, "invalid_fixed_setting.safetensors", meta={"setting.model": "linear_4_2"})
    edit(adam, "invalid_missing_setting.safetensors", drop_meta=["setting.precision"])
    edit(sgd, "invalid_other_run.safetensors", meta={"setting.optimizer": "adamw"})
    for tag, value in [("nan", "nan"), ("huge", "1e300"), ("negative", "-1"), ("fraction", "1.5"),
                       ("beyond_total", "11"), ("text", "two")]:
        edit(adam, "invalid_step_%s.safetensors" % tag, meta={"scalar:step": value})
    edit(adam, "invalid_step_missing.safetensors", drop_meta=["scalar:step"])
    edit(sgd, "invalid_skipped_over_step.safetensors", meta={"scalar:skipped_steps": "3"})
    for base, name, key, value in [
        (sgd, "invalid_schedule_step_disagrees", "schedule.last_step", "1"),
        (sgd, "invalid_scaler_iteration_disagrees", "optim.scaler.iteration", "1"),
        (adam, "invalid_scaler_scale_negative", "optim.scaler.scale", "-1"),
        # A scale of 0 or inf cannot unscale to finite gradients: refused.
        (adam, "invalid_scaler_scale_inf", "optim.scaler.scale", "inf"),
        (adam, "invalid_scaler_scale_zero", "optim.scaler.scale", "0"),
        # Header values that are no setting must be this run's.
        (adam, "invalid_beta1_changed", "optim.optimizer.param_groups.0.beta1", "0.8"),
        (adam, "invalid_adam_step_not_updates", "optim.optimizer.state.0.step", "1"),
        (adam, "invalid_base_lr_nan", "schedule.base_lrs.0", "nan"),
        (adam, "invalid_adam_step_huge", "optim.optimizer.state.0.step", "1e30"),
        (adam, "invalid_beta1_above_one", "optim.optimizer.param_groups.0.beta1", "2"),
    ]:
        edit(base, name + ".safetensors", meta={"scalar:" + key: value})
    edit(adam, "invalid_weight_shape.safetensors", tensors={"model.0.weight": {"shape": [3, 2]}})
    edit(adam, "invalid_master_dtype.safetensors", tensors={"optim.master.0": {"dtype": "I32"}})
    moment = "optim.optimizer.state.0.exp_avg"
    edit(adam, "invalid_moment_shape.safetensors", tensors={moment: {"shape": [6]}})
    edit(adam, "invalid_missing_moment.safetensors", drop=["optim.optimizer.state.1.exp_avg_sq"])
    edit(adam, "invalid_missing_weight.safetensors", drop=["model.0.weight"])
    edit(sgd, "invalid_unexpected_tensor.safetensors", add=("optim.bogus", "F32", [1], bytes(4)))
    ids = "optim.optimizer.param_groups.0.params"
    edit(sgd, "invalid_param_ids.safetensors", tensors={ids: {"dtype": "F64"}})
    with open(os.path.join(out, sgd), "rb") as f:
        write(r, "invalid_truncated.safetensors", f.read()[:-5])


# ---- IDX -----------------------------------------------------------------------------------------


def gz(data):
    return gzip.compress(data, mtime=0)


def idx_seeds():
    r = "idx"

    def idx(dims, payload, type_byte=0x08):
        sizes = b"".join(struct.pack(">I", d) for d in dims)
        return bytes([0, 0, type_byte, len(dims)]) + sizes + payload

    labels = idx([5], bytes([0, 9, 3, 3, 7]))
    images = idx([2, 3, 3], bytes(range(18)))
    write(r, "valid_labels.idx", labels)
    write(r, "valid_images.idx", images)
    write(r, "valid_4d.idx", idx([1, 2, 1, 2], b"\xff\x00\x80\x7f"))
    write(r, "valid_images.idx.gz", gz(images))
    write(r, "invalid_labels_two_gzip_members.idx.gz", gz(labels[:6]) + gz(labels[6:]))
    write(r, "invalid_magic.idx", b"\x01\x00" + labels[2:])
    write(r, "invalid_float_type.idx", idx([2], bytes(8), type_byte=0x0D))
    write(r, "invalid_unknown_type.idx", idx([2], bytes(2), type_byte=0x42))
    write(r, "invalid_zero_dims.idx", bytes([0, 0, 8, 0]))
    write(r, "invalid_five_dims.idx", idx([1, 1, 1, 1, 1], b"\x01"))
    write(r, "invalid_zero_size.idx", idx([2, 0], b""))
    write(r, "invalid_truncated_header.idx", labels[:6])
    write(r, "invalid_truncated_data.idx", images[:-4])
    write(r, "invalid_trailing_bytes.idx", labels + b"\x00")
    write(r, "invalid_huge_dims.idx", idx([0xFFFFFFFF] * 4, b"\x00" * 16))
    write(r, "invalid_gzip_truncated.idx.gz", gz(images)[:-6])
    corrupt = bytearray(gz(images))
    corrupt[-8] ^= 0xFF  # the CRC-32 of the trailer
    write(r, "invalid_gzip_bad_crc.idx.gz", bytes(corrupt))
    # zlib's gzread ignores bytes after the gzip stream that are not a gzip header; the reader
    # checks that the file ends with the stream's trailer.
    write(r, "invalid_gzip_trailing_garbage.idx.gz", gz(labels) + b"garbage")


# ---- token shards --------------------------------------------------------------------------------


def token_shard_seeds():
    r = "token_shard"

    def shard(tokens, magic=20240520, version=1, count=None):
        header = [0] * 256
        header[0], header[1] = magic, version
        header[2] = len(tokens) if count is None else count
        return struct.pack("<256i", *header) + struct.pack("<%dH" % len(tokens), *tokens)

    five = shard([50256, 15496, 995, 0, 65535])
    write(r, "valid_5_tokens.bin", five)
    write(r, "valid_empty.bin", shard([]))
    write(r, "invalid_magic.bin", shard([1, 2], magic=12345))
    write(r, "invalid_llama3_magic.bin", shard([1, 2], magic=20240801))
    write(r, "invalid_version.bin", shard([1, 2], version=2))
    write(r, "invalid_negative_count.bin", shard([1, 2], count=-1))
    write(r, "invalid_huge_count.bin", shard([1, 2], count=2**31 - 1))
    write(r, "invalid_truncated.bin", five[:-1])
    write(r, "invalid_trailing_bytes.bin", five + b"\x00\x00")
    write(r, "invalid_short_header.bin", five[:100])


# ---- text ----------------------------------------------------------------------------------------


def text_seeds():
    r = "text"
    # Every non-empty file is valid text; the vocab_ ones are also valid CharTokenizer
    # vocabularies (strictly increasing bytes, CharTokenizer::FromVocab), but for one.
    write(r, "valid_hello.txt", b"hello world\n")
    write(
        r,
        "valid_verse.txt",
        b"FIRST VOICE:\nWhat light is this, that burns so late tonight?\n\n"
        b"SECOND VOICE:\nThe lamp of one who reads, and will not sleep.\n",
    )
    write(r, "valid_utf8.txt", "na\u00efve caf\u00e9 \u2014 \u65e5\u672c\u8a9e\r\n".encode())
    write(r, "valid_single_byte.txt", b"a")
    write(r, "valid_binary.txt", bytes([0, 0, 255, 10, 13, 0, 127, 128]))
    write(r, "valid_vocab_all_bytes.txt", bytes(range(256)))
    write(r, "valid_vocab_letters.txt", b" !,.:?ABCDEFabcdefghijklmnopqrstuvwxyz")
    write(r, "valid_vocab_not_sorted.txt", b"abca")


def main():
    readers = {
        "safetensors": safetensors_seeds,
        "checkpoint": checkpoint_seeds,
        "idx": idx_seeds,
        "token_shard": token_shard_seeds,
        "text": text_seeds,
    }
    only = sys.argv[1:] or list(readers)
    for reader in only:
        d = os.path.join(CORPUS, reader)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        readers[reader]()
        print("%s: %d files" % (reader, len(os.listdir(d))))


if __name__ == "__main__":
    main()
