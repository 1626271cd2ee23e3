#!/usr/bin/env python3
"""Writes the seed corpora of the .npy, .npz, IDX and config harnesses (tests/fuzz/corpus/).

Standard library only (no numpy on the CI image): the .npy images are written exactly as
numpy.save writes them (format 1.0, header padded to 64 bytes, ending in a newline; one
format 2.0 file), the .npz archives as numpy.savez (stored) and savez_compressed (deflated)
write them. Run it again after changing it; the output is deterministic.
"""
import gzip
import io
import json
import os
import struct
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def npy(descr, shape, payload, version=1):
    dims = "".join(f"{d}," if len(shape) == 1 else f"{d}, " for d in shape).rstrip(", ")
    if len(shape) == 1:
        dims += ","
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({dims}), }}"
    prefix = 10 if version == 1 else 12
    pad = (64 - (prefix + len(header) + 1) % 64) % 64
    header = (header + " " * pad + "\n").encode("latin1")
    size = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + size + header + payload


def pack(fmt, values):
    return struct.pack("<" + fmt * len(values), *values)


NPY = {
    "f4_2x3": npy("<f4", (2, 3), pack("f", [0.5, -1.0, 2.25, 3.0, 1e-3, -7.5])),
    "f8_3": npy("<f8", (3,), pack("d", [1.0, -2.5, 1e10])),
    "f2_2": npy("<f2", (2,), pack("e", [1.5, -0.25])),
    "i8_4": npy("<i8", (4,), pack("q", [0, 1, -5, 9])),
    "i4_2x2": npy("<i4", (2, 2), pack("i", [3, -4, 5, 6])),
    "u1_5": npy("|u1", (5,), bytes([0, 1, 127, 128, 255])),
    "i1_3": npy("|i1", (3,), bytes([0x80, 0x00, 0x7F])),
    "u8_2": npy("<u8", (2,), pack("Q", [1, 2])),
    "f4_scalar": npy("<f4", (), pack("f", [42.0])),
    "f4_empty": npy("<f4", (0,), b""),
    "f4_1x1x1x2": npy("<f4", (1, 1, 1, 2), pack("f", [1.0, 2.0])),
    "f4_v2": npy("<f4", (2,), pack("f", [1.0, 2.0]), version=2),
}


def npz(members, compression):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=compression) as z:
        for name, data in members.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = compression
            z.writestr(info, data)
    return buf.getvalue()


NPZ = {
    "stored_two": npz({"0.weight": NPY["f4_2x3"], "0.bias": NPY["f4_v2"]}, zipfile.ZIP_STORED),
    "deflated_two": npz({"x": NPY["f8_3"], "y": NPY["i8_4"]}, zipfile.ZIP_DEFLATED),
    "stored_mixed": npz({"a": NPY["u1_5"], "b": NPY["f2_2"], "c": NPY["f4_scalar"]}, zipfile.ZIP_STORED),
    "empty_archive": npz({}, zipfile.ZIP_STORED),
}


def idx(shape, values):
    return bytes([0, 0, 0x08, len(shape)]) + b"".join(struct.pack(">I", d) for d in shape) + bytes(values)


# The harness's first byte: odd = it gzips the rest, even = the rest is the file.
RAW, GZIP_IT = b"\x00", b"\x01"
LABELS = idx((6,), [0, 1, 2, 9, 4, 7])
IMAGES = idx((2, 3, 3), range(0, 180, 10))
IDX = {
    "labels_raw": RAW + LABELS,
    "images_raw": RAW + IMAGES,
    "labels_gzipped": GZIP_IT + LABELS,
    "images_gzipped": GZIP_IT + IMAGES,
    "matrix_raw": RAW + idx((2, 2), [1, 2, 3, 4]),
    "four_dims_gzipped": GZIP_IT + idx((1, 2, 1, 2), [5, 6, 7, 8]),
    "images_gz_file": RAW + gzip.compress(IMAGES, mtime=0),
    # Regressions: 4 GiB promised by a 12-byte file (was allocated before reading), and a
    # .gz file whose CRC-32 does not match its data (was accepted).
    "claims_4gib_raw": RAW + bytes([0, 0, 8, 1, 0xFF, 0xFF, 0xFF, 0xFF]) + bytes([1, 2, 3]),
    "bad_crc_gz_file": RAW + (lambda g: g[:-8] + bytes([g[-8] ^ 1]) + g[-7:])(gzip.compress(LABELS, mtime=0)),
}

CONFIGS = {
    "files": {"train-x": "x.npy", "train-y": "y.npy", "model": "4-8-3", "lr": 0.05,
              "epochs": 2, "global-batch": 32, "shuffle": False},
    "dataset": {"dataset": "fashion-mnist", "model": "784-64-10", "optimizer": "adam",
                "base-lr": 0.001, "base-batch": 64, "global-batch": 256, "warmup-steps": 10},
    "sgd_momentum": {"train-x": "x.npy", "train-y": "y.npy", "momentum": 0.9, "nesterov": True,
                     "weight-decay": 0.0001, "seed": 7, "drop-last": True, "activation": "tanh"},
    "checkpoints": {"dataset": "fashion-mnist:/tmp/data", "checkpoint-dir": "ckpt",
                    "checkpoint-every": 100, "keep-checkpoints": 2, "resume": True,
                    "lr-schedule": "multistep", "lr-milestones": "10,20", "lr-gamma": 0.5},
    "outputs": {"train-x": "d.npz:x", "train-y": "d.npz:y", "test-x": "t.npy", "test-y": "u.npy",
                "metrics": "m.jsonl", "plot": "p.svg", "save": "w.npz", "eval-train": True,
                "lr-schedule": "cosine", "device": "cpu"},
}


def write(name, files):
    # Only (re)writes its own files: regression inputs added by hand stay.
    folder = os.path.join(CORPUS, name)
    os.makedirs(folder, exist_ok=True)
    for stem, data in files.items():
        with open(os.path.join(folder, stem), "wb") as f:
            f.write(data)


def main():
    write("npy", NPY)
    write("npz", NPZ)
    write("idx", IDX)
    write("train_config", {k: (json.dumps(v, indent=1) + "\n").encode() for k, v in CONFIGS.items()})


if __name__ == "__main__":
    main()
