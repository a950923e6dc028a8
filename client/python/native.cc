// granary._native: libgranary-client for the Python package `granary`
// (client/python/granary/), written against CPython's stable ABI so that one
// build (`_native.abi3.so`, a `cp39-abi3` wheel) loads into every CPython from
// 3.9 on. Thin: sessions, zero-copy samples with the buffer protocol, and the
// DistributedSampler order from the core plan code (sampler_plan.h). The
// Pythonic layer (Dataset, the torch sampler, ImageFolder) is in the .py
// files; `_native.pyi` types this module; docs/client.md describes both and
// why the binding is the limited C API rather than a binding library.
//
// Errors: a Status becomes a Python exception: kInvalidArgument ValueError,
// kNotFound KeyError, kOutOfRange IndexError, kUnavailable ConnectionError,
// kDeadlineExceeded TimeoutError, kPermissionDenied PermissionError, anything
// else granary.Error (a RuntimeError) whose `code` is the status code's name.
// An argument of the wrong type is a TypeError naming the argument.
//
// Threads: blocking calls release the GIL; a Session serialises its own calls
// (session.h), so Python threads may share one. C++ objects owned by Python
// objects are touched with the GIL held only.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if !defined(Py_LIMITED_API) || Py_LIMITED_API + 0 != 0x03090000
#error "granary._native is built for the stable ABI of CPython 3.9 (Py_LIMITED_API=0x03090000)"
#endif

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "granary/client/sampler_plan.h"
#include "granary/client/session.h"

#ifndef GRANARY_VERSION
#error "GRANARY_VERSION (the project's version) must be defined by the build"
#endif

// The buffer protocol. CPython made Py_buffer, the two buffer slots and these
// functions part of the limited API in 3.11 (PEP 688's groundwork), declaring
// that their layout and symbols had been stable since 3.0; 3.9's and 3.10's
// headers hide them from a limited build only because that had not been
// promised yet. They are declared here, under our own names for the struct,
// exactly as 3.11's pybuffer.h has them; every CPython 3.9+ exports the
// symbols with this layout (the venv tests load the module into 3.9 to 3.13).
extern "C" {
struct GranaryPyBuffer {
  void* buf;
  PyObject* obj;
  Py_ssize_t len;
  Py_ssize_t itemsize;
  int readonly;
  int ndim;
  char* format;
  Py_ssize_t* shape;
  Py_ssize_t* strides;
  Py_ssize_t* suboffsets;
  void* internal;
};
PyAPI_FUNC(int) PyBuffer_FillInfo(GranaryPyBuffer* view, PyObject* o, void* buf, Py_ssize_t len,
                                  int readonly, int flags);
PyAPI_FUNC(int) PyObject_GetBuffer(PyObject* obj, GranaryPyBuffer* view, int flags);
PyAPI_FUNC(void) PyBuffer_Release(GranaryPyBuffer* view);
}

namespace granary::client {
namespace {

namespace sp = sidecar_protocol;

constexpr int kSlotGetBuffer = 1;      // Py_bf_getbuffer (typeslots.h; stable numbers)
constexpr int kSlotReleaseBuffer = 2;  // Py_bf_releasebuffer
constexpr int kBufSimple = 0;          // PyBUF_SIMPLE

PyObject* g_error_type = nullptr;    // granary.Error (a RuntimeError with `code`)
PyObject* g_sample_type = nullptr;   // granary.Sample
PyObject* g_session_type = nullptr;  // granary._native.Session

// ---- errors ---------------------------------------------------------------------------------

// Sets the Python exception for a failed Status; returns nullptr for `return`.
PyObject* SetStatusError(const Status& status) {
  PyObject* type = nullptr;
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      type = PyExc_ValueError;
      break;
    case StatusCode::kNotFound:
      type = PyExc_KeyError;
      break;
    case StatusCode::kOutOfRange:
      type = PyExc_IndexError;
      break;
    case StatusCode::kUnavailable:
      type = PyExc_ConnectionError;
      break;
    case StatusCode::kDeadlineExceeded:
      type = PyExc_TimeoutError;
      break;
    case StatusCode::kPermissionDenied:
      type = PyExc_PermissionError;
      break;
    default:
      break;
  }
  const std::string& message = status.message();
  if (type != nullptr) {
    PyErr_SetString(type, message.c_str());
    return nullptr;
  }
  PyObject* exc = PyObject_CallFunction(g_error_type, "s", message.c_str());
  if (exc == nullptr) return nullptr;
  const std::string_view code = StatusCodeName(status.code());
  PyObject* code_str =
      PyUnicode_FromStringAndSize(code.data(), static_cast<Py_ssize_t>(code.size()));
  if (code_str == nullptr || PyObject_SetAttrString(exc, "code", code_str) != 0) {
    Py_XDECREF(code_str);
    Py_DECREF(exc);
    return nullptr;
  }
  Py_DECREF(code_str);
  PyErr_SetObject(g_error_type, exc);
  Py_DECREF(exc);
  return nullptr;
}

// The name of `o`'s type, for messages ("int", "NoneType").
std::string TypeName(PyObject* o) {
  std::string out = "object";
  PyObject* name = PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(o)), "__name__");
  if (name != nullptr) {
    PyObject* utf8 = PyUnicode_Check(name) ? PyUnicode_AsUTF8String(name) : nullptr;
    if (utf8 != nullptr) {
      out = PyBytes_AsString(utf8);
      Py_DECREF(utf8);
    }
    Py_DECREF(name);
  }
  PyErr_Clear();
  return out;
}

PyObject* TypeErrorFor(const char* what, const char* wanted, PyObject* got) {
  PyErr_Format(PyExc_TypeError, "%s must be %s, not %s", what, wanted, TypeName(got).c_str());
  return nullptr;
}

// ---- argument conversion (false: a Python exception is set) ----------------------------------

// An integer (anything with __index__, not bool's cousins float or str).
bool ToInt64(PyObject* o, const char* what, int64_t* out) {
  PyObject* index = PyNumber_Index(o);
  if (index == nullptr) {
    PyErr_Clear();
    TypeErrorFor(what, "an integer", o);
    return false;
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
  Py_DECREF(index);
  if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    PyErr_Format(PyExc_OverflowError, "%s is out of range (a 64-bit integer)", what);
    return false;
  }
  *out = v;
  return true;
}

bool ToUint64(PyObject* o, const char* what, uint64_t* out) {
  PyObject* index = PyNumber_Index(o);
  if (index == nullptr) {
    PyErr_Clear();
    TypeErrorFor(what, "an integer", o);
    return false;
  }
  const unsigned long long v = PyLong_AsUnsignedLongLong(index);
  Py_DECREF(index);
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_Format(PyExc_OverflowError, "%s is out of range [0, 2**64)", what);
    return false;
  }
  *out = v;
  return true;
}

bool ToUint32(PyObject* o, const char* what, uint32_t* out) {
  uint64_t v = 0;
  if (!ToUint64(o, what, &v)) {
    if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_OverflowError, "%s is out of range [0, 2**32)", what);
    }
    return false;
  }
  if (v > 0xffffffffu) {
    PyErr_Format(PyExc_OverflowError, "%s is out of range [0, 2**32)", what);
    return false;
  }
  *out = static_cast<uint32_t>(v);
  return true;
}

// True or False (ints 0 and 1 too, as the C API's own flags accept).
bool ToBool(PyObject* o, const char* what, bool* out) {
  if (!PyBool_Check(o) && !PyLong_Check(o)) {
    TypeErrorFor(what, "a bool", o);
    return false;
  }
  const int v = PyObject_IsTrue(o);
  if (v < 0) return false;
  *out = v != 0;
  return true;
}

bool ToString(PyObject* o, const char* what, std::string* out) {
  if (!PyUnicode_Check(o)) {
    TypeErrorFor(what, "a str", o);
    return false;
  }
  // Paths may carry bytes that are not UTF-8 (os.fsdecode's surrogates).
  PyObject* bytes = PyUnicode_AsEncodedString(o, "utf-8", "surrogateescape");
  if (bytes == nullptr) return false;
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(bytes, &data, &size) != 0) {
    Py_DECREF(bytes);
    return false;
  }
  out->assign(data, static_cast<size_t>(size));
  Py_DECREF(bytes);
  return true;
}

bool ToSeconds(PyObject* o, const char* what, std::chrono::milliseconds* out) {
  if (!PyFloat_Check(o) && !PyLong_Check(o)) {
    TypeErrorFor(what, "a number of seconds", o);
    return false;
  }
  const double seconds = PyFloat_AsDouble(o);
  if (seconds == -1.0 && PyErr_Occurred()) return false;
  if (!(seconds > 0) || seconds > 1e9) {
    PyErr_Format(PyExc_ValueError, "%s must be a positive number of seconds", what);
    return false;
  }
  *out = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0 + 0.5));
  return true;
}

// A sample id: an integer in [0, 2**32); IndexError beyond.
bool ToSampleId(PyObject* o, uint32_t* out) {
  int64_t id = 0;
  if (!ToInt64(o, "a sample id", &id)) {
    if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
      PyErr_Clear();
      PyErr_SetString(PyExc_IndexError, "sample id is out of range");
    }
    return false;
  }
  if (id < 0 || id > int64_t{0xffffffff}) {
    PyErr_Format(PyExc_IndexError, "sample id %lld is out of range", static_cast<long long>(id));
    return false;
  }
  *out = static_cast<uint32_t>(id);
  return true;
}

// A list, tuple or other iterable of sample ids.
bool ToSampleIds(PyObject* o, std::vector<uint32_t>* out) {
  PyObject* it = PyObject_GetIter(o);
  if (it == nullptr) {
    PyErr_Clear();
    TypeErrorFor("ids", "an iterable of integers", o);
    return false;
  }
  const Py_ssize_t hint = PyObject_Size(o);
  if (hint > 0) {
    out->reserve(static_cast<size_t>(hint));
  } else {
    PyErr_Clear();
  }
  while (PyObject* item = PyIter_Next(it)) {
    uint32_t id = 0;
    const bool ok = ToSampleId(item, &id);
    Py_DECREF(item);
    if (!ok) {
      Py_DECREF(it);
      return false;
    }
    out->push_back(id);
  }
  Py_DECREF(it);
  return !PyErr_Occurred();
}

PyObject* FromString(std::string_view s) {
  return PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape");
}

PyObject* BytesOf(const SampleView& view) {
  return PyBytes_FromStringAndSize(view.data, static_cast<Py_ssize_t>(view.size));
}

// Runs `f` with the GIL released (blocking I/O); `f` must not touch Python.
template <typename F>
auto WithoutGil(F&& f) {
  struct Released {
    PyThreadState* state = PyEval_SaveThread();
    ~Released() { PyEval_RestoreThread(state); }
  } released;
  return f();
}

// Parses (args, kwargs) against `names` into `objects` (borrowed; the
// optional ones left as they were). `required` leading names must be given.
bool ParseArgs(PyObject* args, PyObject* kwargs, const char* function,
               std::initializer_list<const char*> names, size_t required,
               std::vector<PyObject*>* objects) {
  std::string format;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i == required) format += '|';
    format += 'O';
  }
  format += ':';
  format += function;
  std::vector<char*> keywords;
  for (const char* name : names) keywords.push_back(const_cast<char*>(name));
  keywords.push_back(nullptr);
  objects->resize(names.size(), nullptr);
  PyObject** o = objects->data();
  // PyArg_ParseTupleAndKeywords is variadic: one pointer per name (at most 10).
  static_assert(sizeof(PyObject*) == sizeof(void*));
  switch (names.size()) {
    case 1:
      return PyArg_ParseTupleAndKeywords(args, kwargs, format.c_str(), keywords.data(), &o[0]);
    case 2:
      return PyArg_ParseTupleAndKeywords(args, kwargs, format.c_str(), keywords.data(), &o[0],
                                         &o[1]);
    case 3:
      return PyArg_ParseTupleAndKeywords(args, kwargs, format.c_str(), keywords.data(), &o[0],
                                         &o[1], &o[2]);
    case 7:
      return PyArg_ParseTupleAndKeywords(args, kwargs, format.c_str(), keywords.data(), &o[0],
                                         &o[1], &o[2], &o[3], &o[4], &o[5], &o[6]);
    case 8:
      return PyArg_ParseTupleAndKeywords(args, kwargs, format.c_str(), keywords.data(), &o[0],
                                         &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7]);
    case 10:
      return PyArg_ParseTupleAndKeywords(args, kwargs, format.c_str(), keywords.data(), &o[0],
                                         &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8],
                                         &o[9]);
    default:
      PyErr_SetString(PyExc_SystemError, "granary._native: unsupported argument count");
      return false;
  }
}

// ---- Sample ---------------------------------------------------------------------------------

// A zero-copy sample: a pinned view of the arena, released by release(), the
// context manager's exit, or garbage collection. Holds its session, so the
// mapping outlives every Sample. Its buffers (memoryview, numpy.frombuffer)
// are counted: like mmap.close(), release() refuses while any is alive, so no
// view ever shows bytes the sidecar may have reused. (A buffer holds a
// reference to its Sample, so garbage collection never releases one early.)
// A Sample of a chunk file read directly (MappedSample) holds the file's map
// instead of a pin: its bytes never change, and release() drops the map. It
// is verified (XXH3) when its bytes are first used (a buffer, tobytes, a
// comparison, pickling), so the check reads them into the CPU caches right
// before the caller does; a mismatch swaps in the arena's copy (EnsureVerified).
struct SampleState {
  std::shared_ptr<Session> session;
  SampleView view;
  std::shared_ptr<const void> mapping;  // set for a sample of a mapped chunk file
  bool verified = true;                 // false: a mapped sample not checked yet
  bool released = false;
  size_t exports = 0;  // buffers handed out and not yet released

  void Unpin() {
    if (released) return;
    released = true;
    if (mapping != nullptr) {
      mapping.reset();
    } else {
      session->Release(view);
    }
  }
};

struct SampleObject {
  PyObject_HEAD SampleState* state;
};

SampleState& StateOf(PyObject* self) { return *reinterpret_cast<SampleObject*>(self)->state; }

PyObject* NewMappedSample(const std::shared_ptr<Session>& session, MappedSample&& mapped) {
  PyObject* obj = PyType_GenericAlloc(reinterpret_cast<PyTypeObject*>(g_sample_type), 0);
  if (obj == nullptr) return nullptr;
  const SampleView view{mapped.id, mapped.data, mapped.size, mapped.checksum, 0};
  reinterpret_cast<SampleObject*>(obj)->state =
      new SampleState{session, view, std::move(mapped.mapping), /*verified=*/false};
  return obj;
}

PyObject* NewSample(const std::shared_ptr<Session>& session, const SampleView& view) {
  PyObject* obj = PyType_GenericAlloc(reinterpret_cast<PyTypeObject*>(g_sample_type), 0);
  if (obj == nullptr) {
    session->Release(view);
    return nullptr;
  }
  reinterpret_cast<SampleObject*>(obj)->state = new SampleState{session, view};
  return obj;
}

PyObject* SampleNew(PyTypeObject*, PyObject*, PyObject*) {
  PyErr_SetString(PyExc_TypeError,
                  "granary.Sample cannot be created directly: read one with "
                  "granary.Dataset(name, zero_copy=True)[i]");
  return nullptr;
}

void SampleDealloc(PyObject* self) {
  SampleState* state = reinterpret_cast<SampleObject*>(self)->state;
  if (state != nullptr) {
    state->Unpin();
    delete state;
  }
  PyTypeObject* type = Py_TYPE(self);
  auto free_fn = reinterpret_cast<freefunc>(PyType_GetSlot(type, Py_tp_free));
  free_fn(self);
  Py_DECREF(type);
}

bool CheckNotReleased(const SampleState& s) {
  if (!s.released) return true;
  PyErr_Format(PyExc_ValueError, "granary sample %u was released; its bytes may have been reused",
               s.view.id);
  return false;
}

// Checks a mapped sample's bytes before their first use. On a mismatch the
// sample becomes the arena's copy of it (a GET, GIL released; the sidecar's
// own verified read has the node repair the file); a Python error only when
// that fails too. No buffer can exist yet (this runs before the first).
bool EnsureVerified(SampleState& s) {
  if (s.verified) return true;
  const MappedSample mapped{s.view.id, s.view.data, s.view.size, s.view.checksum, s.mapping};
  Status checked = WithoutGil([&] { return s.session->VerifyMapped(mapped); });
  // Another thread may have released it while the GIL was released.
  if (!CheckNotReleased(s)) return false;
  if (checked.ok()) {
    s.verified = true;
    return true;
  }
  Result<SampleView> arena = WithoutGil([&] { return s.session->Get(s.view.id); });
  if (!arena.ok()) {
    SetStatusError(arena.status());
    return false;
  }
  if (s.released) {  // by another thread meanwhile
    s.session->Release(*arena);
    return CheckNotReleased(s);
  }
  s.mapping.reset();
  s.view = *arena;
  s.verified = true;
  return true;
}

int SampleGetBuffer(PyObject* self, GranaryPyBuffer* view, int flags) {
  SampleState& s = StateOf(self);
  if (view != nullptr) view->obj = nullptr;
  if (!CheckNotReleased(s) || !EnsureVerified(s)) return -1;
  // Read-only: a request for a writable buffer fails with BufferError.
  if (PyBuffer_FillInfo(view, self, const_cast<char*>(s.view.data),
                        static_cast<Py_ssize_t>(s.view.size), 1, flags) != 0) {
    return -1;
  }
  ++s.exports;
  return 0;
}

void SampleReleaseBuffer(PyObject* self, GranaryPyBuffer*) {
  SampleState& s = StateOf(self);
  if (s.exports > 0) --s.exports;
}

PyObject* SampleRelease(PyObject* self, PyObject*) {
  SampleState& s = StateOf(self);
  if (s.exports > 0) {
    PyErr_Format(PyExc_BufferError,
                 "cannot release granary sample %u: %zu buffer(s) (memoryview, numpy array) "
                 "still use its memory; delete them first",
                 s.view.id, s.exports);
    return nullptr;
  }
  s.Unpin();
  Py_RETURN_NONE;
}

PyObject* SampleToBytes(PyObject* self, PyObject*) {
  SampleState& s = StateOf(self);
  if (!CheckNotReleased(s) || !EnsureVerified(s)) return nullptr;
  return BytesOf(s.view);
}

PyObject* SampleEnter(PyObject* self, PyObject*) {
  Py_INCREF(self);
  return self;
}

PyObject* SampleExit(PyObject* self, PyObject*) {
  PyObject* r = SampleRelease(self, nullptr);
  if (r == nullptr) return nullptr;
  Py_DECREF(r);
  Py_RETURN_FALSE;
}

PyObject* SampleReduce(PyObject* self, PyObject*) {
  // Pickles (e.g. from a DataLoader worker) as a copy of the bytes.
  SampleState& s = StateOf(self);
  if (!CheckNotReleased(s) || !EnsureVerified(s)) return nullptr;
  PyObject* bytes_type = reinterpret_cast<PyObject*>(&PyBytes_Type);
  return Py_BuildValue("(O(N))", bytes_type, BytesOf(s.view));
}

Py_ssize_t SampleLength(PyObject* self) { return static_cast<Py_ssize_t>(StateOf(self).view.size); }

PyObject* SampleRichCompare(PyObject* self, PyObject* other, int op) {
  if (op != Py_EQ && op != Py_NE) Py_RETURN_NOTIMPLEMENTED;
  SampleState& s = StateOf(self);
  GranaryPyBuffer buffer{};
  if (PyObject_GetBuffer(other, &buffer, kBufSimple) != 0) {
    PyErr_Clear();
    Py_RETURN_NOTIMPLEMENTED;
  }
  if (!CheckNotReleased(s) || !EnsureVerified(s)) {
    PyBuffer_Release(&buffer);
    return nullptr;
  }
  const bool equal = static_cast<uint64_t>(buffer.len) == s.view.size &&
                     std::memcmp(buffer.buf, s.view.data, s.view.size) == 0;
  PyBuffer_Release(&buffer);
  return PyBool_FromLong((op == Py_EQ) == equal ? 1 : 0);
}

PyObject* SampleRepr(PyObject* self) {
  const SampleState& s = StateOf(self);
  return PyUnicode_FromFormat("<granary.Sample id=%u size=%llu%s>", s.view.id,
                              static_cast<unsigned long long>(s.view.size),
                              s.released ? " released" : "");
}

PyObject* SampleIdOf(PyObject* self, void*) {
  return PyLong_FromUnsignedLong(StateOf(self).view.id);
}
PyObject* SampleSize(PyObject* self, void*) {
  return PyLong_FromUnsignedLongLong(StateOf(self).view.size);
}
PyObject* SampleChecksum(PyObject* self, void*) {
  return PyLong_FromUnsignedLongLong(StateOf(self).view.checksum);
}
PyObject* SampleReleased(PyObject* self, void*) { return PyBool_FromLong(StateOf(self).released); }

PyMethodDef kSampleMethods[] = {
    {"release", SampleRelease, METH_NOARGS,
     "Unpins the sample; its memory may be reused by the sidecar afterwards. "
     "BufferError while a memoryview or numpy array of it is alive."},
    {"tobytes", SampleToBytes, METH_NOARGS, "A copy of the bytes."},
    {"__bytes__", SampleToBytes, METH_NOARGS, "A copy of the bytes."},
    {"__enter__", SampleEnter, METH_NOARGS, nullptr},
    {"__exit__", SampleExit, METH_VARARGS, "Releases the sample."},
    {"__reduce__", SampleReduce, METH_NOARGS, "Pickles as a copy of the bytes."},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef kSampleGetSet[] = {
    {"id", SampleIdOf, nullptr, "The sample id.", nullptr},
    {"size", SampleSize, nullptr, "The sample's size in bytes.", nullptr},
    {"checksum", SampleChecksum, nullptr, "XXH3-64 of the bytes, as the sidecar recorded it.",
     nullptr},
    {"released", SampleReleased, nullptr, "Whether release() was called.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

// ---- Session --------------------------------------------------------------------------------

struct SessionObject {
  PyObject_HEAD std::shared_ptr<Session>* session;
};

std::shared_ptr<Session>& SessionOf(PyObject* self) {
  return *reinterpret_cast<SessionObject*>(self)->session;
}

PyObject* SessionNew(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  std::vector<PyObject*> a;
  if (!ParseArgs(args, kwargs, "Session",
                 {"dataset", "socket", "client_name", "connect_timeout", "call_timeout",
                  "lookahead", "verify_checksums", "direct_reads"},
                 1, &a)) {
    return nullptr;
  }
  std::string dataset;
  SessionOptions options;
  if (!ToString(a[0], "dataset", &dataset)) return nullptr;
  if (a[1] != nullptr && !ToString(a[1], "socket", &options.socket_path)) return nullptr;
  if (a[2] != nullptr && !ToString(a[2], "client_name", &options.client_name)) return nullptr;
  if (a[3] != nullptr && !ToSeconds(a[3], "connect_timeout", &options.connect_timeout)) {
    return nullptr;
  }
  if (a[4] != nullptr && !ToSeconds(a[4], "call_timeout", &options.call_timeout)) return nullptr;
  if (a[5] != nullptr && !ToUint32(a[5], "lookahead", &options.lookahead)) return nullptr;
  if (a[6] != nullptr && !ToBool(a[6], "verify_checksums", &options.verify_checksums)) {
    return nullptr;
  }
  if (a[7] != nullptr && !ToBool(a[7], "direct_reads", &options.direct_reads)) return nullptr;
  Result<std::unique_ptr<Session>> session =
      WithoutGil([&] { return Session::Open(dataset, options); });
  if (!session.ok()) return SetStatusError(session.status());
  PyObject* obj = PyType_GenericAlloc(type, 0);
  if (obj == nullptr) return nullptr;
  reinterpret_cast<SessionObject*>(obj)->session =
      new std::shared_ptr<Session>(std::move(session).value());
  return obj;
}

void SessionDealloc(PyObject* self) {
  delete reinterpret_cast<SessionObject*>(self)->session;
  PyTypeObject* type = Py_TYPE(self);
  auto free_fn = reinterpret_cast<freefunc>(PyType_GetSlot(type, Py_tp_free));
  free_fn(self);
  Py_DECREF(type);
}

// One sample, pinned. A hint already in the session's table is taken with
// the GIL held (no I/O; releasing and taking back the GIL would cost more
// than the lookup); anything else is a GET with the GIL released.
std::optional<SampleView> GetOne(Session& s, PyObject* id_object) {
  uint32_t id = 0;
  if (!ToSampleId(id_object, &id)) return std::nullopt;
  if (std::optional<SampleView> hinted = s.TryGetHinted(id)) return hinted;
  Result<SampleView> view = WithoutGil([&] { return s.Get(id); });
  if (!view.ok()) {
    SetStatusError(view.status());
    return std::nullopt;
  }
  return *view;
}

// The sample verified in its chunk file's map (the session's direct reads:
// docs/client.md), asking the sidecar for the chunk's file first when it is
// not known (GIL released for that and for the check). nullopt: not readable
// directly now (use the arena); never sets a Python error.
// `verify` false: for a Sample, which checks it on first use (EnsureVerified).
std::optional<MappedSample> MapDirect(Session& s, uint32_t id, bool verify = true) {
  if (!s.direct_reads_on() || id >= s.info().sample_count) return std::nullopt;
  auto map = [&] { return verify ? s.MapDirect(id) : s.MapDirectUnverified(id); };
  Result<MappedSample> mapped = WithoutGil([&] {
    Result<MappedSample> m = map();
    if (!m.ok() && m.status().code() == StatusCode::kNotFound) {
      s.LocateDirect(std::span<const uint32_t>(&id, 1));
      m = map();
    }
    return m;
  });
  if (!mapped.ok()) return std::nullopt;
  return std::move(mapped).value();
}

// The sample as bytes copied out of its chunk file's map (verified), or
// nullptr with no error set: not readable directly now (use the arena).
PyObject* ReadDirectBytes(Session& s, uint32_t id) {
  std::optional<MappedSample> mapped = MapDirect(s, id);
  if (!mapped) return nullptr;
  return PyBytes_FromStringAndSize(mapped->data, static_cast<Py_ssize_t>(mapped->size));
}

PyObject* SessionRead(PyObject* self, PyObject* id_object) {
  Session& s = *SessionOf(self);
  uint32_t id = 0;
  if (!ToSampleId(id_object, &id)) return nullptr;
  if (id < s.info().sample_count) {
    if (PyObject* direct = ReadDirectBytes(s, id)) return direct;
    if (PyErr_Occurred() != nullptr) return nullptr;
  }
  std::optional<SampleView> v = GetOne(s, id_object);
  if (!v) return nullptr;
  PyObject* bytes = BytesOf(*v);
  s.Release(*v);
  return bytes;
}

PyObject* SessionGet(PyObject* self, PyObject* id) {
  const std::shared_ptr<Session>& s = SessionOf(self);
  uint32_t sample = 0;
  if (!ToSampleId(id, &sample)) return nullptr;
  if (std::optional<MappedSample> mapped = MapDirect(*s, sample, /*verify=*/false)) {
    return NewMappedSample(s, std::move(*mapped));
  }
  std::optional<SampleView> v = GetOne(*s, id);
  if (!v) return nullptr;
  return NewSample(s, *v);
}

// Copies of many samples: those readable directly from their chunk files
// (one CHUNK_FILES round trip for the chunks not known yet), the rest in as
// few GETs as the limits allow.
PyObject* SessionReadMany(PyObject* self, PyObject* ids_object) {
  Session& s = *SessionOf(self);
  std::vector<uint32_t> ids;
  if (!ToSampleIds(ids_object, &ids)) return nullptr;
  if (s.direct_reads_on()) WithoutGil([&] { s.LocateDirect(ids); });
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(ids.size()));
  if (list == nullptr) return nullptr;
  std::vector<uint32_t> rest;
  std::vector<size_t> slots;
  for (size_t i = 0; i < ids.size(); ++i) {
    PyObject* bytes = ids[i] < s.info().sample_count ? ReadDirectBytes(s, ids[i]) : nullptr;
    if (bytes == nullptr && PyErr_Occurred() != nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    if (bytes != nullptr) {
      PyList_SetItem(list, static_cast<Py_ssize_t>(i), bytes);
      continue;
    }
    rest.push_back(ids[i]);
    slots.push_back(i);
  }
  if (rest.empty()) return list;
  std::vector<Result<SampleView>> views = WithoutGil([&] { return s.GetMany(rest); });
  const Status* first_error = nullptr;
  for (const Result<SampleView>& v : views) {
    if (!v.ok() && first_error == nullptr) first_error = &v.status();
  }
  for (size_t j = 0; j < views.size(); ++j) {
    if (!views[j].ok()) continue;
    PyObject* bytes = first_error == nullptr && list != nullptr ? BytesOf(*views[j]) : nullptr;
    s.Release(*views[j]);
    if (bytes == nullptr) {
      Py_CLEAR(list);
      continue;
    }
    PyList_SetItem(list, static_cast<Py_ssize_t>(slots[j]), bytes);
  }
  if (first_error != nullptr) {
    Py_XDECREF(list);
    return SetStatusError(*first_error);
  }
  return list;
}

// Zero-copy samples: those readable directly as views of their chunk files'
// maps (one CHUNK_FILES round trip for the chunks not known yet, each sample
// verified), the rest pinned in the arena in as few GETs as the limits allow.
PyObject* SessionGetMany(PyObject* self, PyObject* ids_object) {
  const std::shared_ptr<Session>& s = SessionOf(self);
  std::vector<uint32_t> ids;
  if (!ToSampleIds(ids_object, &ids)) return nullptr;
  const uint64_t n = s->info().sample_count;
  std::vector<std::optional<MappedSample>> mapped(ids.size());
  if (s->direct_reads_on()) {
    WithoutGil([&] {
      s->LocateDirect(ids);
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] >= n) continue;
        Result<MappedSample> m = s->MapDirectUnverified(ids[i]);  // checked on first use
        if (m.ok()) mapped[i] = std::move(m).value();
      }
    });
  }
  std::vector<uint32_t> rest;
  std::vector<size_t> slots;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (mapped[i]) continue;
    rest.push_back(ids[i]);
    slots.push_back(i);
  }
  std::vector<Result<SampleView>> views;
  if (!rest.empty()) views = WithoutGil([&] { return s->GetMany(rest); });
  const Status* first_error = nullptr;
  for (const Result<SampleView>& v : views) {
    if (!v.ok() && first_error == nullptr) first_error = &v.status();
  }
  PyObject* list =
      first_error == nullptr ? PyList_New(static_cast<Py_ssize_t>(ids.size())) : nullptr;
  for (size_t j = 0; j < views.size(); ++j) {
    if (!views[j].ok()) continue;
    if (list == nullptr) {
      s->Release(*views[j]);
      continue;
    }
    PyObject* sample = NewSample(s, *views[j]);  // releases the view when it fails
    if (sample == nullptr) {
      Py_CLEAR(list);
      continue;
    }
    PyList_SetItem(list, static_cast<Py_ssize_t>(slots[j]), sample);
  }
  if (first_error != nullptr) return SetStatusError(*first_error);
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!mapped[i]) continue;
    PyObject* sample = NewMappedSample(s, std::move(*mapped[i]));
    if (sample == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SetItem(list, static_cast<Py_ssize_t>(i), sample);
  }
  return list;
}

PyObject* StatusResult(const Status& status) {
  if (!status.ok()) return SetStatusError(status);
  Py_RETURN_NONE;
}

bool ToSamplerSpec(PyObject* const* a, uint64_t n, SamplerSpec* spec) {
  spec->sample_count = n;
  return ToUint64(a[0], "seed", &spec->seed) && ToUint64(a[1], "epoch", &spec->epoch) &&
         ToUint32(a[2], "num_replicas", &spec->num_replicas) &&
         ToUint32(a[3], "rank", &spec->rank) && ToBool(a[4], "shuffle", &spec->shuffle) &&
         ToBool(a[5], "drop_last", &spec->drop_last);
}

PyObject* SessionAnnounceSampler(PyObject* self, PyObject* args, PyObject* kwargs) {
  std::vector<PyObject*> a;
  if (!ParseArgs(
          args, kwargs, "announce_sampler",
          {"seed", "epoch", "num_replicas", "rank", "shuffle", "drop_last", "start_position"}, 6,
          &a)) {
    return nullptr;
  }
  Session& s = *SessionOf(self);
  SamplerSpec spec;
  uint64_t start = 0;
  if (!ToSamplerSpec(a.data(), s.info().sample_count, &spec)) return nullptr;
  if (a[6] != nullptr && !ToUint64(a[6], "start_position", &start)) return nullptr;
  Result<sp::SetPlan> plan = SamplerSetPlan(spec, start);
  if (!plan.ok()) return SetStatusError(plan.status());
  return StatusResult(WithoutGil([&] { return s.SetPlan(*plan); }));
}

PyObject* SessionSetPlan(PyObject* self, PyObject* args, PyObject* kwargs) {
  std::vector<PyObject*> a;
  if (!ParseArgs(args, kwargs, "set_plan",
                 {"plan_id", "seed", "epoch", "world_size", "rank", "batch_size", "drop_last",
                  "mode", "window_chunks", "start_position"},
                 5, &a)) {
    return nullptr;
  }
  sp::SetPlan plan;
  plan.batch_size = 1;
  plan.window_chunks = kDefaultChunkWindow;
  std::string mode = "global";
  if (!ToString(a[0], "plan_id", &plan.plan_id) || !ToUint64(a[1], "seed", &plan.seed) ||
      !ToUint64(a[2], "epoch", &plan.epoch) || !ToUint32(a[3], "world_size", &plan.world_size) ||
      !ToUint32(a[4], "rank", &plan.rank) ||
      (a[5] != nullptr && !ToUint32(a[5], "batch_size", &plan.batch_size)) ||
      (a[6] != nullptr && !ToBool(a[6], "drop_last", &plan.drop_last)) ||
      (a[7] != nullptr && !ToString(a[7], "mode", &mode)) ||
      (a[8] != nullptr && !ToUint32(a[8], "window_chunks", &plan.window_chunks)) ||
      (a[9] != nullptr && !ToUint64(a[9], "start_position", &plan.start_position))) {
    return nullptr;
  }
  Result<PlanMode> parsed = ParsePlanMode(mode);
  if (!parsed.ok()) return SetStatusError(parsed.status());
  plan.mode = static_cast<uint8_t>(*parsed);
  Session& s = *SessionOf(self);
  return StatusResult(WithoutGil([&] { return s.SetPlan(plan); }));
}

PyObject* SessionNext(PyObject* self, PyObject* args, PyObject* kwargs) {
  std::vector<PyObject*> a;
  if (!ParseArgs(args, kwargs, "next", {"max"}, 0, &a)) return nullptr;
  uint32_t max = 1;
  if (a[0] != nullptr && !ToUint32(a[0], "max", &max)) return nullptr;
  const std::shared_ptr<Session>& s = SessionOf(self);
  bool end_of_epoch = false;
  Result<std::vector<Result<SampleView>>> got =
      WithoutGil([&] { return s->Next(max, &end_of_epoch); });
  if (!got.ok()) return SetStatusError(got.status());
  PyObject* list = PyList_New(0);
  for (Result<SampleView>& v : *got) {
    if (list == nullptr) {
      if (v.ok()) s->Release(*v);
      continue;
    }
    PyObject* item = nullptr;
    if (v.ok()) {
      item = NewSample(s, *v);
    } else {
      item = Py_None;
      Py_INCREF(item);
    }
    if (item == nullptr || PyList_Append(list, item) != 0) Py_CLEAR(list);
    Py_XDECREF(item);
  }
  if (list == nullptr) return nullptr;
  return Py_BuildValue("(NO)", list, end_of_epoch ? Py_True : Py_False);
}

PyObject* SessionFlush(PyObject* self, PyObject*) {
  Session& s = *SessionOf(self);
  return StatusResult(WithoutGil([&] { return s.Flush(); }));
}

PyObject* SessionPing(PyObject* self, PyObject*) {
  Session& s = *SessionOf(self);
  return StatusResult(WithoutGil([&] { return s.Ping(); }));
}

PyObject* SessionStat(PyObject* self, PyObject* id_object) {
  uint32_t id = 0;
  if (!ToSampleId(id_object, &id)) return nullptr;
  Session& s = *SessionOf(self);
  Result<sp::StatEntry> entry = WithoutGil([&] { return s.Stat(id); });
  if (!entry.ok()) return SetStatusError(entry.status());
  return Py_BuildValue("(NKL)", FromString(entry->path),
                       static_cast<unsigned long long>(entry->size),
                       static_cast<long long>(entry->mtime_ns));
}

PyObject* SessionPaths(PyObject* self, PyObject* args, PyObject* kwargs) {
  std::vector<PyObject*> a;
  if (!ParseArgs(args, kwargs, "paths", {"first", "count"}, 2, &a)) return nullptr;
  uint32_t first = 0;
  uint32_t count = 0;
  if (!ToUint32(a[0], "first", &first) || !ToUint32(a[1], "count", &count)) return nullptr;
  Session& s = *SessionOf(self);
  Result<std::vector<sp::StatEntry>> entries = WithoutGil([&] { return s.List(first, count); });
  if (!entries.ok()) return SetStatusError(entries.status());
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(entries->size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < entries->size(); ++i) {
    PyObject* path = FromString((*entries)[i].path);
    if (path == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SetItem(list, static_cast<Py_ssize_t>(i), path);
  }
  return list;
}

PyObject* SessionDirectories(PyObject* self, PyObject*) {
  Session& s = *SessionOf(self);
  Result<std::vector<sp::DirectoryItem>> dirs = WithoutGil([&] { return s.Directories(); });
  if (!dirs.ok()) return SetStatusError(dirs.status());
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(dirs->size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < dirs->size(); ++i) {
    PyObject* item = Py_BuildValue("(NI)", FromString((*dirs)[i].path),
                                   static_cast<unsigned int>((*dirs)[i].mode));
    if (item == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SetItem(list, static_cast<Py_ssize_t>(i), item);
  }
  return list;
}

PyObject* SessionLookup(PyObject* self, PyObject* path_object) {
  std::string path;
  if (!ToString(path_object, "path", &path)) return nullptr;
  Session& s = *SessionOf(self);
  Result<uint32_t> id = WithoutGil([&] { return s.Lookup(path); });
  if (!id.ok()) return SetStatusError(id.status());
  return PyLong_FromUnsignedLong(*id);
}

PyObject* SessionInOpeningProcess(PyObject* self, PyObject*) {
  return PyBool_FromLong(SessionOf(self)->InOpeningProcess());
}

PyObject* SessionName(PyObject* self, void*) { return FromString(SessionOf(self)->info().name); }
PyObject* SessionManifestId(PyObject* self, void*) {
  return FromString(SessionOf(self)->info().manifest_id.ToHex());
}
PyObject* SessionSampleCount(PyObject* self, void*) {
  return PyLong_FromUnsignedLongLong(SessionOf(self)->info().sample_count);
}
PyObject* SessionTotalBytes(PyObject* self, void*) {
  return PyLong_FromUnsignedLongLong(SessionOf(self)->info().total_bytes);
}
PyObject* SessionChunkCount(PyObject* self, void*) {
  return PyLong_FromUnsignedLongLong(SessionOf(self)->info().chunk_count);
}
PyObject* SessionSocketPath(PyObject* self, void*) {
  return FromString(SessionOf(self)->socket_path());
}
PyObject* SessionSidecarName(PyObject* self, void*) {
  return FromString(SessionOf(self)->sidecar_name());
}
PyObject* SessionArenaBytes(PyObject* self, void*) {
  return PyLong_FromUnsignedLongLong(SessionOf(self)->arena_bytes());
}
PyObject* SessionPid(PyObject* self, void*) { return PyLong_FromLong(SessionOf(self)->pid()); }
PyObject* SessionPinnedCount(PyObject* self, void*) {
  return PyLong_FromSize_t(SessionOf(self)->pinned_count());
}
PyObject* SessionHintCount(PyObject* self, void*) {
  return PyLong_FromSize_t(SessionOf(self)->hint_count());
}
PyObject* SessionProtocolVersion(PyObject* self, void*) {
  return PyLong_FromUnsignedLong(SessionOf(self)->protocol_version());
}

// NOLINTBEGIN(cppcoreguidelines-pro-type-cstyle-cast): CPython's calling conventions
#define GRANARY_KW(f) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(f))
// {"samples", "bytes", "chunk_files", "fallbacks", "corrupt", "dropped"}:
// what the direct reads did (DirectReadCounters).
PyObject* SessionDirectCounters(PyObject* self, PyObject*) {
  const DirectReadCounters c = SessionOf(self)->direct_counters();
  return Py_BuildValue("{sKsKsKsKsKsK}", "samples", static_cast<unsigned long long>(c.samples),
                       "bytes", static_cast<unsigned long long>(c.bytes), "chunk_files",
                       static_cast<unsigned long long>(c.chunk_files), "fallbacks",
                       static_cast<unsigned long long>(c.fallbacks), "corrupt",
                       static_cast<unsigned long long>(c.corrupt), "dropped",
                       static_cast<unsigned long long>(c.dropped));
}

PyMethodDef kSessionMethods[] = {
    {"read", SessionRead, METH_O, "The sample's bytes (a copy; the pin is released at once)."},
    {"read_many", SessionReadMany, METH_O,
     "Each sample's bytes (copies), in one round trip where possible."},
    {"get", SessionGet, METH_O,
     "The sample without a copy: a view of its mapped chunk file (direct reads, checked on "
     "first use) or of the sidecar's shared memory, held until released."},
    {"get_many", SessionGetMany, METH_O,
     "Many samples without a copy (as get), one request for the chunk files not known yet."},
    {"announce_sampler", GRANARY_KW(SessionAnnounceSampler), METH_VARARGS | METH_KEYWORDS,
     "SET_PLAN for a DistributedSampler over all of the dataset's samples."},
    {"set_plan", GRANARY_KW(SessionSetPlan), METH_VARARGS | METH_KEYWORDS,
     "SET_PLAN: the order a rank will read (mode global, chunkwise or sequential)."},
    {"next", GRANARY_KW(SessionNext), METH_VARARGS | METH_KEYWORDS,
     "The plan's next samples and whether the epoch ended (None for a failed sample)."},
    {"flush", SessionFlush, METH_NOARGS, "Sends the queued releases."},
    {"ping", SessionPing, METH_NOARGS, "A round trip to the sidecar."},
    {"stat", SessionStat, METH_O, "(path, size, mtime_ns) from the manifest."},
    {"paths", GRANARY_KW(SessionPaths), METH_VARARGS | METH_KEYWORDS,
     "Paths of ids [first, first + count)."},
    {"directories", SessionDirectories, METH_NOARGS,
     "[(path, mode)] of every directory but the root, sorted by path."},
    {"lookup", SessionLookup, METH_O, "The id of a path relative to the dataset root."},
    {"direct_counters", SessionDirectCounters, METH_NOARGS,
     "What direct reads did: samples, bytes, chunk_files, fallbacks, corrupt, dropped."},
    {"in_opening_process", SessionInOpeningProcess, METH_NOARGS,
     "Whether this process opened the session (False in a forked child)."},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef kSessionGetSet[] = {
    {"name", SessionName, nullptr, "The dataset's name.", nullptr},
    {"manifest_id", SessionManifestId, nullptr, "The snapshot's id (hex).", nullptr},
    {"sample_count", SessionSampleCount, nullptr, "Samples in the snapshot.", nullptr},
    {"total_bytes", SessionTotalBytes, nullptr, "Bytes of all samples.", nullptr},
    {"chunk_count", SessionChunkCount, nullptr, "Chunks of the snapshot.", nullptr},
    {"socket_path", SessionSocketPath, nullptr, "The sidecar's socket.", nullptr},
    {"sidecar_name", SessionSidecarName, nullptr, "The sidecar's name (HELLO).", nullptr},
    {"arena_bytes", SessionArenaBytes, nullptr, "Size of the mapped arena.", nullptr},
    {"pid", SessionPid, nullptr, "The process that opened the session.", nullptr},
    {"pinned_count", SessionPinnedCount, nullptr, "Samples this session pins.", nullptr},
    {"hint_count", SessionHintCount, nullptr, "Lookahead hints held.", nullptr},
    {"protocol_version", SessionProtocolVersion, nullptr, "The negotiated protocol version.",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

// ---- module functions -----------------------------------------------------------------------

PyObject* RankSamples(PyObject*, PyObject* args, PyObject* kwargs) {
  std::vector<PyObject*> a;
  if (!ParseArgs(args, kwargs, "rank_samples",
                 {"n", "seed", "epoch", "num_replicas", "rank", "shuffle", "drop_last"}, 7, &a)) {
    return nullptr;
  }
  uint64_t n = 0;
  SamplerSpec spec;
  if (!ToUint64(a[0], "n", &n) || !ToSamplerSpec(a.data() + 1, n, &spec)) return nullptr;
  Result<std::vector<SampleId>> ids = WithoutGil([&] { return SamplerIndices(spec); });
  if (!ids.ok()) return SetStatusError(ids.status());
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(ids->size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < ids->size(); ++i) {
    PyObject* id = PyLong_FromUnsignedLongLong((*ids)[i]);
    if (id == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SetItem(list, static_cast<Py_ssize_t>(i), id);
  }
  return list;
}

PyObject* RankShareOf(PyObject*, PyObject* args, PyObject* kwargs) {
  std::vector<PyObject*> a;
  if (!ParseArgs(args, kwargs, "rank_share", {"n", "num_replicas", "drop_last"}, 3, &a)) {
    return nullptr;
  }
  uint64_t n = 0;
  uint32_t num_replicas = 0;
  bool drop_last = false;
  if (!ToUint64(a[0], "n", &n) || !ToUint32(a[1], "num_replicas", &num_replicas) ||
      !ToBool(a[2], "drop_last", &drop_last)) {
    return nullptr;
  }
  if (num_replicas == 0) {
    PyErr_SetString(PyExc_ValueError, "num_replicas must be at least 1");
    return nullptr;
  }
  const RankShare share = ComputeRankShare(n, num_replicas, drop_last);
  return Py_BuildValue("(KK)", static_cast<unsigned long long>(share.num_samples),
                       static_cast<unsigned long long>(share.total_size));
}

PyObject* ValidatePath(PyObject*, PyObject* path_object) {
  std::string path;
  if (!ToString(path_object, "path", &path)) return nullptr;
  return StatusResult(ValidateSamplePath(path));
}

PyObject* ResolveSocket(PyObject*, PyObject* configured_object) {
  std::string configured;
  if (!ToString(configured_object, "configured", &configured)) return nullptr;
  return FromString(ResolveSocketPath(configured));
}

PyMethodDef kModuleMethods[] = {
    {"rank_samples", GRANARY_KW(RankSamples), METH_VARARGS | METH_KEYWORDS,
     "The indices DistributedSampler(rank) yields in an epoch (granary's plan code)."},
    {"rank_share", GRANARY_KW(RankShareOf), METH_VARARGS | METH_KEYWORDS,
     "(num_samples, total_size) as DistributedSampler computes them."},
    {"validate_sample_path", ValidatePath, METH_O,
     "ValueError for a path that could leave the dataset root."},
    {"resolve_socket_path", ResolveSocket, METH_O,
     "The socket path: `configured`, else $GRANARY_SOCKET, else the default."},
    {nullptr, nullptr, 0, nullptr}};
#undef GRANARY_KW
// NOLINTEND(cppcoreguidelines-pro-type-cstyle-cast)

PyModuleDef kModule = {PyModuleDef_HEAD_INIT,
                       "granary._native",
                       "libgranary-client binding (see the granary package).",
                       -1,
                       kModuleMethods,
                       nullptr,
                       nullptr,
                       nullptr,
                       nullptr};

PyObject* MakeType(const char* name, const char* doc, int basic_size,
                   std::vector<PyType_Slot> slots) {
  slots.push_back({Py_tp_doc, const_cast<char*>(doc)});
  slots.push_back({0, nullptr});
  PyType_Spec spec = {name, basic_size, 0, Py_TPFLAGS_DEFAULT, slots.data()};
  return PyType_FromSpec(&spec);
}

PyObject* InitModule() {
  PyObject* m = PyModule_Create(&kModule);
  if (m == nullptr) return nullptr;
  g_error_type = PyErr_NewExceptionWithDoc(
      "granary.Error",
      "A Granary failure that no built-in exception names; `code` is the status "
      "code's name (e.g. 'VERSION_MISMATCH', 'CORRUPTION').",
      PyExc_RuntimeError, nullptr);
  g_sample_type = MakeType(
      "granary.Sample",
      "A sample's bytes without a copy (read-only): in its mapped chunk file (direct reads) or "
      "in the sidecar's shared memory.\n\n"
      "Supports the buffer protocol (memoryview(s), numpy.frombuffer(s)); held until "
      "release(), the end of a with block, or garbage collection.",
      static_cast<int>(sizeof(SampleObject)),
      {{Py_tp_new, reinterpret_cast<void*>(SampleNew)},
       {Py_tp_dealloc, reinterpret_cast<void*>(SampleDealloc)},
       {Py_tp_methods, kSampleMethods},
       {Py_tp_getset, kSampleGetSet},
       {Py_tp_richcompare, reinterpret_cast<void*>(SampleRichCompare)},
       // Hash by identity would lie: __eq__ compares bytes, but a pinned view is not a value.
       {Py_tp_hash, reinterpret_cast<void*>(PyObject_HashNotImplemented)},
       {Py_tp_repr, reinterpret_cast<void*>(SampleRepr)},
       {Py_sq_length, reinterpret_cast<void*>(SampleLength)},
       {kSlotGetBuffer, reinterpret_cast<void*>(SampleGetBuffer)},
       {kSlotReleaseBuffer, reinterpret_cast<void*>(SampleReleaseBuffer)}});
  g_session_type = MakeType("granary._native.Session",
                            "A session with the sidecar on one dataset.\n\n"
                            "Session(dataset, socket='', client_name='', connect_timeout=10.0, "
                            "call_timeout=120.0, lookahead=64, verify_checksums=False)",
                            static_cast<int>(sizeof(SessionObject)),
                            {{Py_tp_new, reinterpret_cast<void*>(SessionNew)},
                             {Py_tp_dealloc, reinterpret_cast<void*>(SessionDealloc)},
                             {Py_tp_methods, kSessionMethods},
                             {Py_tp_getset, kSessionGetSet}});
  if (g_error_type == nullptr || g_sample_type == nullptr || g_session_type == nullptr) {
    Py_DECREF(m);
    return nullptr;
  }
  // PyModule_AddObject steals a reference; the module keeps these for good.
  Py_INCREF(g_error_type);
  Py_INCREF(g_sample_type);
  Py_INCREF(g_session_type);
  if (PyModule_AddObject(m, "Error", g_error_type) != 0 ||
      PyModule_AddObject(m, "Sample", g_sample_type) != 0 ||
      PyModule_AddObject(m, "Session", g_session_type) != 0 ||
      PyModule_AddStringConstant(m, "__version__", GRANARY_VERSION) != 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}

}  // namespace
}  // namespace granary::client

PyMODINIT_FUNC PyInit__native() { return granary::client::InitModule(); }
