#!/usr/bin/env python3
"""Test data for the GGUF reader (tests/test_gguf.c); run from the repository root
in a venv outside the repository:

    python3 -m venv /work/venv-gguf
    /work/venv-gguf/bin/pip install gguf==0.19.0 numpy safetensors
    /work/venv-gguf/bin/python tests/tools/gguf_testdata.py [GOLDEN_DIR]

Writes, with gguf-py's GGUFWriter and its reference dequantiser as the truth:

  tests/data/gguf/types.gguf          one tensor of every type tpgen decodes, random valid
                                      blocks (random bytes with sane f16 scales), plus metadata
                                      of every GGUF value type (nested arrays too), alignment 64
  tests/data/gguf/types_ref.safetensors   gguf-py's dequantised f32 values of each tensor
  tests/data/gguf/types.json          each tensor's type, ne[] and the metadata values written, and
                                      the sha256 of gguf-py's f32 values of all 65536 F16 / BF16 codes
  tests/data/gguf/golden.json         for the golden flux2-gguf files (GOLDEN_DIR, default
                                      build/golden/flux2-gguf): each tensor's type, ne[],
                                      byte offset and the sha256 of gguf-py's dequantised f32 bytes
  fuzz/corpus/gguf/*                  small valid seeds for fuzz/fuzz_gguf.c
"""
import hashlib, importlib.metadata, json, os, sys
import numpy as np
import gguf
from gguf import GGMLQuantizationType as T, GGUFValueType as V
from gguf.quants import dequantize
from safetensors.numpy import save_file

rng = np.random.default_rng(20261201)

# byte offsets of each block type's f16 fields (scales and mins): random bytes
# there would make inf/NaN or absurd values, so they get sane random halves
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.IQ4_NL: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.IQ4_XS: [0],
}


def random_blocks(qt, rows, cols):
    bs, nb = gguf.GGML_QUANT_SIZES[qt]
    b = rng.integers(0, 256, size=(rows, cols // bs, nb), dtype=np.uint8)
    for off in F16_FIELDS[qt]:
        h = (rng.uniform(0.002, 0.05, size=(rows, cols // bs)) * rng.choice([-1, 1], size=(rows, cols // bs)))
        b[:, :, off:off + 2] = h.astype(np.float16).view(np.uint8).reshape(rows, cols // bs, 2)
    return b.reshape(rows, cols // bs * nb)


def types_file(out_dir):
    w = gguf.GGUFWriter(os.path.join(out_dir, 'types.gguf'), arch='tpgen-test')
    w.add_custom_alignment(64)
    meta = {
        'test.u8': (250, V.UINT8), 'test.i8': (-100, V.INT8), 'test.u16': (65000, V.UINT16),
        'test.i16': (-30000, V.INT16), 'test.u32': (4000000000, V.UINT32), 'test.i32': (-2000000000, V.INT32),
        'test.f32': (0.15625, V.FLOAT32), 'test.bool': (True, V.BOOL), 'test.string': ('héllo, GGUF', V.STRING),
        'test.u64': (2**63 + 5, V.UINT64), 'test.i64': (-2**62, V.INT64), 'test.f64': (-2.5e-300, V.FLOAT64),
    }
    for k, (v, t) in meta.items():
        w.add_key_value(k, v, t)
    arrays = {
        'test.arr_i32': [-1, 0, 7, 2**31 - 1],
        'test.arr_str': ['a', '', 'Ġthe', 'tokens ✓'],
        'test.arr_f32': [0.5, -1.25, 3.0],
        'test.arr_nested': [[1, 2], [3], [4, 5, 6]],
    }
    for k, v in arrays.items():
        w.add_array(k, v)
    tensors, ref = {}, {}
    for qt in [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS]:
        rows, cols = 2, 768   # 3 K-quant blocks or 24 legacy blocks per row
        raw = random_blocks(qt, rows, cols)
        name = 'w.' + qt.name
        w.add_tensor(name, raw, raw_dtype=qt)
        ref[name] = dequantize(raw, qt).astype(np.float32).reshape(rows, cols)
        tensors[name] = {'type': qt.name, 'ne': [cols, rows]}
    x = rng.standard_normal((3, 5, 7)).astype(np.float32)   # a 3-D F32 tensor: ne = [7, 5, 3]
    w.add_tensor('x.F32', x)
    ref['x.F32'] = x
    tensors['x.F32'] = {'type': 'F32', 'ne': [7, 5, 3]}
    h = (rng.standard_normal((4, 33)) * 3).astype(np.float16)  # rows not whole blocks of anything but 1
    w.add_tensor('x.F16', h)
    ref['x.F16'] = dequantize(h.view(np.uint8), T.F16).reshape(4, 33)
    tensors['x.F16'] = {'type': 'F16', 'ne': [33, 4]}
    bf = gguf.quants.quantize(rng.standard_normal((2, 40)).astype(np.float32), T.BF16)
    w.add_tensor('x.BF16', bf, raw_dtype=T.BF16)
    ref['x.BF16'] = dequantize(bf, T.BF16).reshape(2, 40)
    tensors['x.BF16'] = {'type': 'BF16', 'ne': [40, 2]}
    v1 = rng.standard_normal(100).astype(np.float32)           # 1-D
    w.add_tensor('v.F32', v1)
    ref['v.F32'] = v1
    tensors['v.F32'] = {'type': 'F32', 'ne': [100]}
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    save_file({k: np.ascontiguousarray(v) for k, v in ref.items()}, os.path.join(out_dir, 'types_ref.safetensors'))
    # every 16-bit code (NaN payloads, infinities, subnormals) through the F16 and BF16 dequantisers
    codes = np.arange(65536, dtype='<u2').view(np.uint8)
    all_codes = {q.name: hashlib.sha256(dequantize(codes.reshape(-1, 2) if q == T.BF16 else codes, q)
                                        .astype('<f4').tobytes()).hexdigest() for q in (T.F16, T.BF16)}
    meta_json = {k: v for k, (v, t) in meta.items()}
    meta_json['test.u64'] = str(meta_json['test.u64'])   # beyond int64: JSON readers differ
    meta_json.update(arrays)
    with open(os.path.join(out_dir, 'types.json'), 'w') as f:
        json.dump({'gguf': importlib.metadata.version('gguf'), 'numpy': np.__version__,
                   'alignment': 64, 'tensors': tensors, 'metadata': meta_json,
                   'all_codes_sha256': all_codes}, f, indent=1, ensure_ascii=False)


def golden_json(golden, out_dir):
    res = {}
    for v in ['Q8_0', 'Q4_K', 'mixed']:
        p = os.path.join(golden, v, 'transformer', f'flux2-tiny-{v}.gguf')
        r = gguf.GGUFReader(p)
        ts = {}
        for t in r.tensors:
            deq = dequantize(t.data, t.tensor_type).astype('<f4')
            ts[t.name] = {'type': t.tensor_type.name, 'ne': [int(x) for x in t.shape],
                          'offset': int(t.data_offset), 'sha256': hashlib.sha256(deq.tobytes()).hexdigest()}
        res[v] = {'file': os.path.relpath(p, golden), 'bytes': os.path.getsize(p), 'tensors': ts}
    with open(os.path.join(out_dir, 'golden.json'), 'w') as f:
        json.dump(res, f, indent=1)


def fuzz_seeds(fuzz_dir):
    os.makedirs(fuzz_dir, exist_ok=True)
    for i, qt in enumerate([T.Q8_0, T.Q4_K, T.Q6_K, T.Q5_0, T.IQ4_XS, T.F16]):
        p = os.path.join(fuzz_dir, f'seed-{qt.name}.gguf')
        w = gguf.GGUFWriter(p, arch='flux')
        w.add_array('tokenizer.ggml.tokens', ['a', 'b'])
        w.add_array('nested', [[1], [2, 3]])
        w.add_float32('eps', 1e-6)
        if qt == T.F16:
            w.add_tensor('t', rng.standard_normal((2, 3)).astype(np.float16))
        else:
            bs = gguf.GGML_QUANT_SIZES[qt][0]
            w.add_tensor('t', random_blocks(qt, 1, bs), raw_dtype=qt)
        w.add_tensor('n', np.ones(4, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


if __name__ == '__main__':
    golden = sys.argv[1] if len(sys.argv) > 1 else 'build/golden/flux2-gguf'   # tests/unpack-golden.sh
    out = 'tests/data/gguf'
    os.makedirs(out, exist_ok=True)
    types_file(out)
    golden_json(golden, out)
    fuzz_seeds('fuzz/corpus/gguf')
