/* visionipc._fill: a server's writes into a frame buffer, in the order clients rely on (buffer.py).

Why C: a copying send() in Python runs cold interpreter code once per frame (after ~50 ms asleep) between
the caller's call and the first pixel and between the last pixel and the doorbell; one call removes it
(bench/vipc_latency.py compares the hand-off with a bare memcpy of the frame). A numpy frame's memory is read
through numpy's C API, which is cheaper cold than its buffer export. And the order is enforced: a large
memcpy may use non-temporal stores, which x86 does not keep in order with ordinary stores, so a fence sits
between gen_start and the pixels and between the pixels and the announcement fields; gen_end is a release
store.

The trailer is six little-endian uint64 words (protocol.TRAILER): gen_start, gen_end, frame_id,
timestamp_sof, timestamp_eof, valid. Every argument is checked before the first store, so a bad call
leaves the buffer as it was. The GIL is held through the copy: a thread switch in between would only delay
the frame.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <stdint.h>
#include <string.h>

enum { TR_GEN_START, TR_GEN_END, TR_FRAME_ID, TR_SOF, TR_EOF, TR_VALID, TRAILER_WORDS };

/* An integer in [0, 2**64) (anything with __index__), or ValueError naming the argument and its value. */
static int to_u64(PyObject *obj, const char *name, uint64_t *out) {
  PyObject *index = PyNumber_Index(obj);
  unsigned long long value = (unsigned long long)-1;
  if (index != NULL) {
    value = PyLong_AsUnsignedLongLong(index);
    Py_DECREF(index);
  }
  if (PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "%s must be an integer in [0, 2**64), got %R", name, obj);
    return -1;
  }
  *out = value;
  return 0;
}

/* The announcement fields of a fill, checked. */
typedef struct {
  uint64_t generation, frame_id, sof, eof, valid;
} Fields;

static int parse_fields(PyObject *const *args, Fields *f) {
  if (to_u64(args[0], "generation", &f->generation) < 0 || to_u64(args[1], "frame_id", &f->frame_id) < 0 ||
      to_u64(args[2], "timestamp_sof", &f->sof) < 0 || to_u64(args[3], "timestamp_eof", &f->eof) < 0)
    return -1;
  int valid = PyObject_IsTrue(args[4]);
  if (valid < 0)
    return -1;
  f->valid = (uint64_t)valid;
  return 0;
}

/* The trailer's words, from a writable buffer of at least six aligned uint64 words. */
static volatile uint64_t *trailer_words(PyObject *obj, Py_buffer *view) {
  if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
    return NULL;
  if (view->len < (Py_ssize_t)(TRAILER_WORDS * sizeof(uint64_t)) || (uintptr_t)view->buf % sizeof(uint64_t)) {
    PyErr_Format(PyExc_ValueError, "trailer must be %d aligned uint64 words, got %zd bytes at offset %zu mod 8",
                 TRAILER_WORDS, view->len, (size_t)((uintptr_t)view->buf % sizeof(uint64_t)));
    PyBuffer_Release(view);
    return NULL;
  }
  return (volatile uint64_t *)view->buf;
}

static void store_start(volatile uint64_t *t, uint64_t generation) {
  t[TR_GEN_START] = generation;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);  /* before any pixel store, non-temporal ones included */
}

static void store_complete(volatile uint64_t *t, const Fields *f) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);  /* every pixel store before the fields and the doorbell */
  t[TR_FRAME_ID] = f->frame_id;
  t[TR_SOF] = f->sof;
  t[TR_EOF] = f->eof;
  t[TR_VALID] = f->valid;
  __atomic_store_n((uint64_t *)&t[TR_GEN_END], f->generation, __ATOMIC_RELEASE);
}

static int check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t expected) {
  if (nargs == expected)
    return 0;
  PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments, got %zd", name, expected, nargs);
  return -1;
}

PyDoc_STRVAR(start_doc, "start(trailer, generation)\n\n"
             "Store gen_start = generation, fenced before the pixel writes that follow (get_buffer).");

static PyObject *start(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  uint64_t generation;
  Py_buffer view;
  if (check_nargs("start", nargs, 2) < 0 || to_u64(args[1], "generation", &generation) < 0)
    return NULL;
  volatile uint64_t *t = trailer_words(args[0], &view);
  if (t == NULL)
    return NULL;
  store_start(t, generation);
  PyBuffer_Release(&view);
  Py_RETURN_NONE;
}

PyDoc_STRVAR(complete_doc, "complete(trailer, generation, frame_id, timestamp_sof, timestamp_eof, valid)\n\n"
             "Fence the pixel writes, store the announcement fields, then gen_end = generation (send_buffer).");

static PyObject *complete(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  Fields f;
  Py_buffer view;
  if (check_nargs("complete", nargs, 6) < 0 || parse_fields(args + 1, &f) < 0)
    return NULL;
  volatile uint64_t *t = trailer_words(args[0], &view);
  if (t == NULL)
    return NULL;
  store_complete(t, &f);
  PyBuffer_Release(&view);
  Py_RETURN_NONE;
}

/* The bytes of a frame: a C-contiguous ndarray's memory directly, anything else through the buffer protocol
   (then view->obj is set and the caller releases the view). TypeError if it has no contiguous bytes. */
static int frame_bytes(PyObject *obj, Py_buffer *view, const void **buf, Py_ssize_t *len) {
  view->obj = NULL;
  if (PyArray_Check(obj) && PyArray_IS_C_CONTIGUOUS((PyArrayObject *)obj)) {
    *buf = PyArray_DATA((PyArrayObject *)obj);
    *len = PyArray_NBYTES((PyArrayObject *)obj);
    return 0;
  }
  if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "frame data must be a C-contiguous bytes-like object, got %s",
                 Py_TYPE(obj)->tp_name);
    return -1;
  }
  *buf = view->buf;
  *len = view->len;
  return 0;
}

PyDoc_STRVAR(fill_doc, "fill(dst, trailer, src, generation, frame_id, timestamp_sof, timestamp_eof, valid) -> int\n\n"
             "Copy src into dst between start() and complete() and return src's length in bytes. If that length\n"
             "is not dst's, nothing is written (the caller raises). A src that is not a C-contiguous\n"
             "bytes-like object is a TypeError.");

static PyObject *fill(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  Fields f;
  Py_buffer dst, src, trailer;
  const void *src_buf;
  Py_ssize_t src_len;
  if (check_nargs("fill", nargs, 8) < 0 || parse_fields(args + 3, &f) < 0 ||
      frame_bytes(args[2], &src, &src_buf, &src_len) < 0)
    return NULL;
  if (PyObject_GetBuffer(args[0], &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
    PyBuffer_Release(&src);
    return NULL;
  }
  volatile uint64_t *t = trailer_words(args[1], &trailer);
  if (t == NULL) {
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return NULL;
  }
  if (src_len == dst.len) {
    store_start(t, f.generation);
    memcpy(dst.buf, src_buf, (size_t)src_len);
    store_complete(t, &f);
  }
  PyBuffer_Release(&trailer);
  PyBuffer_Release(&dst);
  PyBuffer_Release(&src);  /* a no-op for an ndarray read directly */
  return PyLong_FromSsize_t(src_len);
}

static PyMethodDef methods[] = {
  {"start", (PyCFunction)(void (*)(void))start, METH_FASTCALL, start_doc},
  {"complete", (PyCFunction)(void (*)(void))complete, METH_FASTCALL, complete_doc},
  {"fill", (PyCFunction)(void (*)(void))fill, METH_FASTCALL, fill_doc},
  {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
  PyModuleDef_HEAD_INIT, "visionipc._fill", "A server's ordered writes into a frame buffer (see _fill.c).", -1,
  methods,
};

PyMODINIT_FUNC PyInit__fill(void) {
  import_array();  /* numpy's C API; returns NULL with the ImportError set if numpy cannot be imported */
  return PyModule_Create(&module_def);
}
