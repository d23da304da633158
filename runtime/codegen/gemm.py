"""A generated, register-blocked GEMM for the generated code: C (M x N, row-major, ldc) = Ap @ B, where Ap is
the constant operand packed once at build (pack_a) and B (K x N, row-major, ldb) is read at run time.

Layout and loops (the BLIS decomposition):
- the register tile is MR rows x NR columns of C: NR = NR_VECTORS vectors of the target's vl float32 lanes,
  MR = accumulator registers left after the NR vectors of B and one broadcast (gemm_geometry);
- Ap: the constant rows in panels of MR rows, each panel K x MR (k-major), rows past M zero: one broadcast per
  row and k reads consecutive floats. Packed with numpy at build, so a run never repacks the weights;
- per block of NC columns and KC rows of B, that block is copied into a scratch of NR-wide panels (KC x NR,
  columns past N zero) that stays in the L2; the KC x NR panel the micro-kernel streams stays in the L1 while
  it meets every MR-row panel of one MC-row block of Ap;
- the first K block stores its tile, later ones add theirs to C: every C element's sum runs in the fixed order
  k = 0..K-1 within a block and the blocks in order, so one program gives bit-identical results on every run
  (no run-time dispatch, no threads inside a call).
Partial tiles (M, N not multiples of MR, NR) compute the full tile on the zero padding and store only the valid
part; the padding never reaches C. The multiply-adds contract to FMAs as the rest of the generated code's do.
"""
from __future__ import annotations

import numpy as np

NR_VECTORS = 2          # vectors of B (columns of C) per register tile
KC = 256                # rows of B per block: a KC x NR panel of packed B (32 KiB at 16 lanes) stays in the L1
NC_BYTES = 512 << 10    # one KC x NC block of packed B: stays in the L2 while every MR panel of A meets it
MC_ROWS = 96            # rows of packed A per block (rounded up to whole MR panels): with KC, about 96 KiB that stay
#                         in the L2 next to the block of packed B
REGISTERS = {4: 16, 8: 16, 16: 32}   # vector registers of the ISA with that many float32 lanes (SSE, AVX2, AVX-512)


def supported(vl: int) -> bool:
  return vl in REGISTERS


def gemm_geometry(vl: int) -> tuple[int, int]:
  """(MR, NR) for vl-lane vectors: NR_VECTORS vectors across and as many rows as the registers hold with the
  NR_VECTORS B vectors and one broadcast live (AVX-512: 14 x 32; AVX2: 6 x 16, the classic Haswell tile).
  The more rows, the more multiply-adds per load of B: the tile is bound by its loads, not its FMAs."""
  regs = REGISTERS.get(vl, 16)
  return (regs - NR_VECTORS - 1) // NR_VECTORS, NR_VECTORS * vl


def packed_a_size(m: int, k: int, mr: int) -> int:
  return -(-m // mr) * mr * k


def pack_a(a: np.ndarray, mr: int) -> np.ndarray:
  """(G, M, K) float32 -> (G, ceil(M/MR), K, MR): each MR-row panel k-major, the rows past M zero."""
  g, m, k = a.shape
  panels = -(-m // mr)
  padded = np.zeros((g, panels * mr, k), np.float32)
  padded[:, :m] = a
  return np.ascontiguousarray(padded.reshape(g, panels, mr, k).transpose(0, 1, 3, 2))


def scratch_floats(n: int, k: int, vl: int) -> int:
  """Floats of the packed-B scratch one call with N columns and K rows needs."""
  _, nr = gemm_geometry(vl)
  kc = min(KC, k)
  nc = _nc(vl)
  return kc * min(-(-n // nr) * nr, nc)


def _nc(vl: int) -> int:
  _, nr = gemm_geometry(vl)
  return max(nr, NC_BYTES // (4 * KC) // nr * nr)


def source(vl: int) -> str:
  """C source of `pm_gemm(M, N, K, Ap, B, ldb, C, ldc, Bp)`: static functions for one program's kernel (needs the
  vector prelude's vf type). Bp is a scratch of scratch_floats(N, K) floats."""
  mr, nr = gemm_geometry(vl)
  nv = NR_VECTORS
  nc = _nc(vl)
  mc = -(-MC_ROWS // mr) * mr   # whole panels: a block's first row starts a panel
  acc = [f"c{i}_{j}" for i in range(mr) for j in range(nv)]
  L = []
  w = L.append
  w(f"/* register tile {mr} x {nr}: {mr * nv} accumulators */")
  w("static inline __attribute__((always_inline)) void pm_tile(i64 kc, const float* restrict a, "
    "const float* restrict b, float* restrict c, i64 ldc, int add, i64 rows, i64 cols) {")
  w("  vf " + ", ".join(f"{x} = {{0}}" for x in acc) + ";")
  w("  for (i64 k = 0; k < kc; k++) {")
  for j in range(nv):
    w(f"    vf b{j} = vf_load(b + {j * vl});")
  for i in range(mr):
    w(f"    {{ vf av = (vf){{0}} + a[{i}];")
    for j in range(nv):
      w(f"      c{i}_{j} += av * b{j};")
    w("    }")
  w(f"    a += {mr}; b += {nr};")
  w("  }")
  w(f"  if (rows == {mr} && cols == {nr}) {{")
  for i in range(mr):
    for j in range(nv):
      p = f"c + {i} * ldc + {j * vl}"
      w(f"    vf_store({p}, add ? vf_load({p}) + c{i}_{j} : c{i}_{j});")
  w("    return;")
  w("  }")
  w(f"  float t[{mr}][{nr}];")
  for i in range(mr):
    for j in range(nv):
      w(f"  vf_store(&t[{i}][{j * vl}], c{i}_{j});")
  w("  for (i64 i = 0; i < rows; i++)")
  w("    for (i64 j = 0; j < cols; j++) c[i * ldc + j] = add ? c[i * ldc + j] + t[i][j] : t[i][j];")
  w("}")
  w("static void pm_gemm(i64 M, i64 N, i64 K, const float* restrict Ap, const float* restrict B, i64 ldb, "
    "float* restrict C, i64 ldc, float* restrict Bp) {")
  w("  if (K <= 0) {  /* an empty sum: C = 0, as sgemm with beta 0 */")
  w("    for (i64 i = 0; i < M; i++) for (i64 j = 0; j < N; j++) C[i * ldc + j] = 0.0f;")
  w("    return;")
  w("  }")
  w(f"  const i64 panels_k = K * {mr};")
  w(f"  for (i64 jc = 0; jc < N; jc += {nc}) {{")
  w(f"    const i64 nc = N - jc < {nc} ? N - jc : {nc};")
  w(f"    for (i64 pc = 0; pc < K; pc += {KC}) {{")
  w(f"      const i64 kc = K - pc < {KC} ? K - pc : {KC};")
  # pack B[pc:pc+kc, jc:jc+nc] into NR-wide panels, kc x NR each, columns past N zero
  w(f"      for (i64 jp = 0; jp < nc; jp += {nr}) {{")
  w("        float* restrict dst = Bp + jp * kc;")
  w("        const float* restrict src = B + pc * ldb + jc + jp;")
  w(f"        if (nc - jp >= {nr}) {{")
  w("          for (i64 k = 0; k < kc; k++)")
  w("            { " + " ".join(f"vf_store(dst + k * {nr} + {j * vl}, vf_load(src + k * ldb + {j * vl}));" for j in range(nv)) + " }")
  w("        } else {")
  w("          const i64 w = nc - jp;")
  w("          for (i64 k = 0; k < kc; k++)")
  w(f"            for (i64 j = 0; j < {nr}; j++) dst[k * {nr} + j] = j < w ? src[k * ldb + j] : 0.0f;")
  w("        }")
  w("      }")
  w(f"      for (i64 ic = 0; ic < M; ic += {mc}) {{")
  w(f"        const i64 mc = M - ic < {mc} ? M - ic : {mc};")
  w(f"        for (i64 jr = 0; jr < nc; jr += {nr}) {{")
  w(f"          const i64 cols = nc - jr < {nr} ? nc - jr : {nr};")
  w(f"          for (i64 ir = 0; ir < mc; ir += {mr}) {{")
  w(f"            const i64 rows = mc - ir < {mr} ? mc - ir : {mr};")
  w(f"            pm_tile(kc, Ap + (ic + ir) / {mr} * panels_k + pc * {mr}, Bp + jr * kc, "
    "C + (ic + ir) * ldc + jc + jr, ldc, pc > 0, rows, cols);")
  w("          }")
  w("        }")
  w("      }")
  w("    }")
  w("  }")
  w("}")
  return "\n".join(L) + "\n"
