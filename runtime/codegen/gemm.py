"""A generated, register-blocked GEMM for the generated code, in two forms that share one register tile:
- pm_gemm: C (M x N, row-major, ldc) = Ap @ B, where Ap is the constant operand packed once at build (pack_a)
  and B (K x N, row-major, ldb) is read at run time (a conv: weights times im2col columns or the input itself);
- pm_gemm_b: C = A @ Bp, where Bp is the constant operand packed once at build (pack_b) and A (M x K, at any
  row and column strides) is read at run time (a MatMul or Gemm by constant weights: activations times weights).

Layout and loops (the BLIS decomposition):
- the register tile is MR rows x NR columns of C: NR = NR_VECTORS vectors of the target's vl float32 lanes,
  MR at most the accumulator registers left after the NR vectors of B and one broadcast (gemm_geometry), and
  fewer where that balances the row panels of a short M (panel_rows);
- Ap: the constant rows in panels of MR rows, each panel K x MR (k-major), rows past M zero: one broadcast per
  row and k reads consecutive floats. Packed with numpy at build, so a run never repacks the weights;
- per block of NC columns and KC rows of B, that block is copied into a scratch of NR-wide panels (KC x NR,
  columns past N zero) that stays in the L2; the KC x NR panel the micro-kernel streams stays in the L1 while
  it meets every MR-row panel of one MC-row block of Ap;
- pm_gemm_b mirrors it: Bp holds NR-column panels (K x NR, k-major, columns past N zero) packed at build, and per
  KC rows and MC-row block of A, that block is copied into a scratch of MR-row panels (KC x MR, rows past M zero)
  that stays in the L2 while every KC x NR slice of Bp meets it from the L1;
- the first K block stores its tile, later ones add theirs to C: every C element's sum runs in the fixed order
  k = 0..K-1 within a block and the blocks in order, so one program gives bit-identical results on every run;
- threads: a GEMM of at least PAR_MIN_MACS multiply-adds is cut into parts, whole NR-column panels of C (pm_gemm)
  or whole MR-row panels (pm_gemm_b), run by the runner's pm_split on the threads the program runs with (an
  extern argument; 0 runs it whole). Each part packs into its own buffer (part 0, always the caller's, into the
  kernel's scratch, any other on the stack of the thread that runs it) and writes only its panels of C, and every C element is computed by the
  same tile in the same order on any number of threads: the results are bit-identical for every thread count.
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
PAR_MIN_MACS = 1 << 19  # multiply-adds below which a GEMM runs on one thread (its parts' packing and claims cost more)
PART_STACK_FLOATS = 1 << 18  # most floats a part keeps on its thread's stack (1 MiB; link.py gives workers 8 MiB)
REGISTERS = {4: 16, 8: 16, 16: 32}   # vector registers of the ISA with that many float32 lanes (SSE, AVX2, AVX-512)


def supported(vl: int) -> bool:
  return vl in REGISTERS


def gemm_geometry(vl: int) -> tuple[int, int]:
  """(MR, NR) for vl-lane vectors: NR_VECTORS vectors across and as many rows as the registers hold with the
  NR_VECTORS B vectors and one broadcast live (AVX-512: 14 x 32; AVX2: 6 x 16, the classic Haswell tile).
  The more rows, the more multiply-adds per load of B: the tile is bound by its loads, not its FMAs."""
  regs = REGISTERS.get(vl, 16)
  return (regs - NR_VECTORS - 1) // NR_VECTORS, NR_VECTORS * vl


def panel_rows(m: int, vl: int) -> int:
  """MR for a GEMM with m rows: the fewest panels of at most gemm_geometry's MR rows, balanced, so the padding
  rows (multiply-adds whose products are thrown away) are fewer than the panels (m = 16: two panels of 8 rather
  than 14 + 2 padded to 28). A register tile with fewer rows has fewer multiply-adds per load of B, but here
  they are the useful ones."""
  most, _ = gemm_geometry(vl)
  return -(-max(m, 1) // -(-max(m, 1) // most))


def packed_a_size(m: int, k: int, mr: int) -> int:
  return -(-m // mr) * mr * k


def pack_a(a: np.ndarray, mr: int) -> np.ndarray:
  """(G, M, K) float32 -> (G, ceil(M/MR), K, MR): each MR-row panel k-major, the rows past M zero."""
  g, m, k = a.shape
  panels = -(-m // mr)
  padded = np.zeros((g, panels * mr, k), np.float32)
  padded[:, :m] = a
  return np.ascontiguousarray(padded.reshape(g, panels, mr, k).transpose(0, 1, 3, 2))


def packed_b_size(k: int, n: int, nr: int) -> int:
  return packed_a_size(n, k, nr)


def pack_b(b: np.ndarray, nr: int) -> np.ndarray:
  """(K, N) float32 -> (ceil(N/NR), K, NR): each NR-column panel k-major, the columns past N zero: B^T packed as
  pack_a packs A, with NR rows per panel."""
  return pack_a(b.T[None], nr)[0]


def scratch_floats_a(m: int, k: int, mr: int) -> int:
  """Floats of the packed-A scratch one pm_gemm_b call with M rows and K columns of A in MR-row panels needs."""
  return min(KC, k) * min(-(-m // mr) * mr, _mc(mr))


def _mc(mr: int) -> int:
  return -(-MC_ROWS // mr) * mr   # whole panels: a block's first row starts a panel


def scratch_floats(n: int, k: int, vl: int) -> int:
  """Floats of the packed-B scratch one call with N columns and K rows needs."""
  _, nr = gemm_geometry(vl)
  kc = min(KC, k)
  nc = _nc(vl)
  return kc * min(-(-n // nr) * nr, nc)


def _nc(vl: int) -> int:
  _, nr = gemm_geometry(vl)
  return max(nr, NC_BYTES // (4 * KC) // nr * nr)


def source(vl: int, packed: str = "a", mr: int = 0) -> str:
  """C source of the register tile and, for packed "a", `pm_gemm(M, N, K, Ap, B, ldb, C, ldc, Bp, split)` (Bp a
  scratch of scratch_floats(N, K) floats) or, for packed "b", `pm_gemm_b(M, N, K, A, rs, cs, Bp, C, ldc, Ap, split)`
  (A's element (m, k) at A[m * rs + k * cs], Ap a scratch of scratch_floats_a(M, K) floats), split the runner's
  pm_split or 0 (one thread): static functions for one
  program's kernel (they need the vector prelude's vf type). mr: the rows of the register tile (panel_rows; 0:
  gemm_geometry's most), the rows of the panels the packed A is laid out in."""
  assert packed in ("a", "b")
  most, nr = gemm_geometry(vl)
  mr = mr or most
  assert 1 <= mr <= most, f"a register tile of {mr} rows does not fit the registers ({most} at most)"
  nv = NR_VECTORS
  nc = _nc(vl)
  mc = _mc(mr)
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
    w(f"    {{ vf av = a[{i}] - (vf){{}};")   # a splat the compiler folds into the FMA's broadcast operand (see render.splat)
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
  w("#ifndef PM_SPLIT_T")
  w("#define PM_SPLIT_T")
  w("typedef void (*pm_par_t)(void* const*, int64_t, int64_t);")
  w("typedef void (*pm_split_t)(pm_par_t, void* const*, int64_t);")
  w("#endif")
  w("struct pm_gemm_job { i64 M, N, K, ld, ldc, rs, cs; const float* a; const float* b; float* c; float* scratch; };")
  (_gemm_b if packed == "b" else _gemm_a)(w, vl, mr, nr, mc, nc)
  # the parts: NR-column panels of C (packed A) or MR-row panels (packed B); part 0 (lo == 0: the runner always
  # runs it on the caller) packs into the kernel's scratch, any other into a buffer on its thread's stack
  # (PART_STACK_FLOATS: the runner's workers have 8 MiB; the caller, which also takes parts, needs 1 MiB free)
  unit, extent = (nr, "N") if packed == "a" else (mr, "M")
  own = KC * (nc if packed == "a" else mc)
  assert own <= PART_STACK_FLOATS
  w("static __attribute__((noinline)) void pm_gemm_own(const struct pm_gemm_job* j, i64 lo, i64 hi) {")
  w(f"  float buf[{own}] __attribute__((aligned(64)));")
  w("  pm_gemm_range(j, lo, hi, buf);")
  w("}")
  w("static void pm_gemm_part(void* const* args, int64_t lo, int64_t hi) {")
  w("  const struct pm_gemm_job* j = (const struct pm_gemm_job*)(const void*)args;")
  w(f"  const i64 a = lo * {unit}, b = hi * {unit} < j->{extent} ? hi * {unit} : j->{extent};")
  w("  if (lo == 0) pm_gemm_range(j, a, b, j->scratch);")
  w("  else pm_gemm_own(j, a, b);")
  w("}")
  fn, args = ("pm_gemm_b", "const float* restrict A, i64 rs, i64 cs, const float* restrict Bp, float* restrict C, i64 ldc, "
              "float* restrict Ap") if packed == "b" else \
      ("pm_gemm", "const float* restrict Ap, const float* restrict B, i64 ldb, float* restrict C, i64 ldc, float* restrict Bp")
  w(f"static void {fn}(i64 M, i64 N, i64 K, {args}, pm_split_t split) {{")
  w("  if (M <= 0 || N <= 0) return;")
  w("  if (K <= 0) {  /* an empty sum: C = 0, as sgemm with beta 0 */")
  w("    for (i64 i = 0; i < M; i++) for (i64 j = 0; j < N; j++) C[i * ldc + j] = 0.0f;")
  w("    return;")
  w("  }")
  if packed == "b":
    w("  const struct pm_gemm_job j = {M, N, K, 0, ldc, rs, cs, A, Bp, C, Ap};")
  else:
    w("  const struct pm_gemm_job j = {M, N, K, ldb, ldc, 0, 0, Ap, B, C, Bp};")
  w(f"  const i64 parts = ({extent} + {unit - 1}) / {unit};")
  w(f"  if (split != 0 && parts > 1 && M * N * K >= {PAR_MIN_MACS}) split(pm_gemm_part, (void* const*)(const void*)&j, parts);")
  w("  else pm_gemm_part((void* const*)(const void*)&j, 0, parts);")
  w("}")
  return "\n".join(L) + "\n"


def _gemm_a(w, vl: int, mr: int, nr: int, mc: int, nc: int) -> None:
  """pm_gemm_range for packed A: columns [n0, n1) of C (n0 a multiple of NR), packing B into Bp."""
  nv = NR_VECTORS
  w("static void pm_gemm_range(const struct pm_gemm_job* j, i64 n0, i64 n1, float* restrict Bp) {")
  w("  const i64 M = j->M, N = n1 - n0, K = j->K, ldb = j->ld, ldc = j->ldc;")
  w("  const float* restrict Ap = j->a;")
  w("  const float* restrict B = j->b + n0;")
  w("  float* restrict C = j->c + n0;")
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


def _gemm_b(w, vl: int, mr: int, nr: int, mc: int, nc: int) -> None:
  """pm_gemm_range for packed B: rows [m0, m1) of C (m0 a multiple of MR), packing A into Ap: the loops of
  _gemm_a with the roles of the operands swapped (see the module docstring)."""
  w("static void pm_gemm_range(const struct pm_gemm_job* j, i64 m0, i64 m1, float* restrict Ap) {")
  w("  const i64 N = j->N, K = j->K, rs = j->rs, cs = j->cs, ldc = j->ldc;")
  w("  const float* restrict Bp = j->b;")
  w(f"  for (i64 pc = 0; pc < K; pc += {KC}) {{")
  w(f"    const i64 kc = K - pc < {KC} ? K - pc : {KC};")
  w(f"    for (i64 ic = m0; ic < m1; ic += {mc}) {{")
  w(f"      const i64 mc = m1 - ic < {mc} ? m1 - ic : {mc};")
  # pack A[ic:ic+mc, pc:pc+kc] into MR-row panels, kc x MR each, rows past the range zero
  w(f"      for (i64 ip = 0; ip < mc; ip += {mr}) {{")
  w("        float* restrict dst = Ap + ip * kc;")
  w(f"        const i64 h = mc - ip < {mr} ? mc - ip : {mr};")
  w("        if (rs == 1) {  /* A's rows adjacent (a transposed operand): each k reads h consecutive floats */")
  w("          const float* restrict src = j->a + (ic + ip) + pc * cs;")
  w("          for (i64 k = 0; k < kc; k++)")
  w(f"            for (i64 r = 0; r < {mr}; r++) dst[k * {mr} + r] = r < h ? src[k * cs + r] : 0.0f;")
  w("        } else {")
  w(f"          for (i64 r = 0; r < {mr}; r++) {{")
  w("            if (r < h) {")
  w("              const float* restrict src = j->a + (ic + ip + r) * rs + pc * cs;")
  w(f"              for (i64 k = 0; k < kc; k++) dst[k * {mr} + r] = src[k * cs];")
  w("            } else {")
  w(f"              for (i64 k = 0; k < kc; k++) dst[k * {mr} + r] = 0.0f;")
  w("            }")
  w("          }")
  w("        }")
  w("      }")
  w(f"      for (i64 jr = 0; jr < N; jr += {nr}) {{")
  w(f"        const i64 cols = N - jr < {nr} ? N - jr : {nr};")
  w(f"        for (i64 ir = 0; ir < mc; ir += {mr}) {{")
  w(f"          const i64 rows = mc - ir < {mr} ? mc - ir : {mr};")
  w(f"          pm_tile(kc, Ap + ir * kc, Bp + jr * K + pc * {nr}, j->c + (ic + ir) * ldc + jr, ldc, pc > 0, rows, cols);")
  w("        }")
  w("      }")
  w("    }")
  w("  }")
  w("}")
