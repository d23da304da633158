"""NV12 geometry: tight layout and the padded VENUS layout that camerad produces.

Y rows start at `r*stride`; the interleaved UV plane (half resolution) starts at `uv_offset`. Consumers must
always use stride and uv_offset, never width, because padded and tight buffers coexist.
"""


def _align(value: int, alignment: int) -> int:
  return (value + alignment - 1) // alignment * alignment


def get_nv12_info(width: int, height: int) -> tuple[int, int, int, int]:
  """(stride, y_height, uv_height, size) by the Qualcomm VENUS rules; uv_offset = stride * y_height."""
  if not isinstance(width, int) or not isinstance(height, int) or width <= 0 or height <= 0:
    raise ValueError(f"NV12 frame size must be positive ints, got {width!r}x{height!r}")
  stride = _align(width, 128)
  y_height = _align(height, 32)
  uv_height = _align((height + 1) // 2, 16)
  size = _align(stride * y_height + stride * uv_height + 4096 + max(16384, 8 * stride), 4096)
  size = _align(size + _align(width, 512) * 512, 4096)
  return stride, y_height, uv_height, size


def padded_nv12_layout(width: int, height: int) -> tuple[int, int, int]:
  """(size, stride, uv_offset) of the padded camerad layout, in create_buffers_with_sizes argument order."""
  stride, y_height, _, size = get_nv12_info(width, height)
  return size, stride, stride * y_height


def tight_nv12_layout(width: int, height: int) -> tuple[int, int, int]:
  """(size, stride, uv_offset) of tight NV12: no row padding, UV right after Y (w*h*3/2 bytes)."""
  return width * height * 3 // 2, width, width * height


def check_geometry(width: int, height: int, size: int, stride: int, uv_offset: int) -> None:
  """Raise ValueError naming the offending value unless both planes fit inside `size` bytes."""
  for name, value in (("width", width), ("height", height), ("size", size), ("stride", stride)):
    if not isinstance(value, int) or value <= 0:
      raise ValueError(f"NV12 {name} must be a positive int, got {value!r}")
  if width % 2 or height % 2:
    raise ValueError(f"NV12 needs an even width and height (chroma is subsampled 2x2), got {width}x{height}")
  if not isinstance(uv_offset, int) or uv_offset < 0:
    raise ValueError(f"NV12 uv_offset must be a non-negative int, got {uv_offset!r}")
  if stride < width:
    raise ValueError(f"NV12 stride {stride} is smaller than the width {width}")
  if uv_offset < stride * (height - 1) + width:
    raise ValueError(f"NV12 uv_offset {uv_offset} overlaps the Y plane ({height} rows of stride {stride})")
  uv_end = uv_offset + stride * (height // 2 - 1) + width
  if uv_end > size:
    raise ValueError(f"NV12 size {size} too small: the UV plane ends at byte {uv_end} "
                     f"({width}x{height}, stride {stride}, uv_offset {uv_offset})")
