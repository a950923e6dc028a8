// granary._native: the pybind11 binding of libgranary-client for the Python
// package `granary` (client/python/granary/). Thin: sessions, zero-copy
// samples with the buffer protocol, and the DistributedSampler order from the
// core plan code (sampler_plan.h). The Pythonic layer (Dataset, the torch
// sampler, ImageFolder) is in the .py files; docs/client.md describes both.
//
// Errors: a Status becomes a Python exception: kInvalidArgument ValueError,
// kNotFound KeyError, kOutOfRange IndexError, kUnavailable ConnectionError,
// kDeadlineExceeded TimeoutError, kPermissionDenied PermissionError, anything
// else granary.Error (a RuntimeError) whose `code` is the status code's name.
//
// Threads: blocking calls release the GIL; a Session serialises its own calls
// (session.h), so Python threads may share one.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "granary/client/sampler_plan.h"
#include "granary/client/session.h"

namespace granary::client {
namespace {

namespace py = pybind11;
namespace sp = sidecar_protocol;

// A failed Status on its way to Python (translated with the GIL held).
class StatusError : public std::exception {
 public:
  explicit StatusError(Status status) : status_(std::move(status)), what_(status_.message()) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  Status status_;
  std::string what_;
};

[[noreturn]] void Throw(const Status& status) { throw StatusError(status); }

void ThrowIfError(const Status& status) {
  if (!status.ok()) Throw(status);
}

template <typename T>
T ValueOrThrow(Result<T> result) {
  if (!result.ok()) Throw(result.status());
  return std::move(result).value();
}

std::chrono::milliseconds Millis(double seconds, const char* what) {
  if (!(seconds > 0) || seconds > 1e9) {
    throw py::value_error(std::string(what) + " must be a positive number of seconds");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0 + 0.5));
}

// A zero-copy sample: a pinned view of the arena, released by release(), the
// context manager's exit, or garbage collection. Holds its session, so the
// mapping outlives every Sample. Its buffers (memoryview, numpy.frombuffer)
// are counted: like mmap.close(), release() refuses while any is alive, so no
// view ever shows bytes the sidecar may have reused. (A buffer holds a
// reference to its Sample, so garbage collection never releases one early.)
class PySample {
 public:
  PySample(std::shared_ptr<Session> session, SampleView view)
      : session_(std::move(session)), view_(view) {}
  ~PySample() { Unpin(); }
  PySample(const PySample&) = delete;
  PySample& operator=(const PySample&) = delete;

  // release() from Python.
  void Release() {
    if (exports_ > 0) {
      throw py::buffer_error("cannot release granary sample " + std::to_string(view_.id) + ": " +
                             std::to_string(exports_) +
                             " buffer(s) (memoryview, numpy array) still use its memory; "
                             "delete them first");
    }
    Unpin();
  }
  bool released() const { return released_; }
  const SampleView& view() const { return view_; }
  void CheckNotReleased() const {
    if (released_) {
      throw py::value_error("granary sample " + std::to_string(view_.id) +
                            " was released; its bytes may have been reused");
    }
  }
  void AddExport() { ++exports_; }
  void RemoveExport() {
    if (exports_ > 0) --exports_;
  }

 private:
  void Unpin() {
    if (released_) return;
    released_ = true;
    if (session_) session_->Release(view_);
  }

  std::shared_ptr<Session> session_;
  SampleView view_;
  bool released_ = false;
  size_t exports_ = 0;  // buffers handed out and not yet released (GIL held)
};

// The Sample type's bf_getbuffer: pybind11's def_buffer cannot refuse (an
// exception there terminates), so the type gets these two instead. They run
// with the GIL held and never throw.
int SampleGetBuffer(PyObject* obj, Py_buffer* view, int flags) {
  PySample* sample = nullptr;
  try {
    sample = py::handle(obj).cast<PySample*>();
  } catch (...) {
    sample = nullptr;
  }
  if (view != nullptr) view->obj = nullptr;
  if (sample == nullptr || view == nullptr) {
    PyErr_SetString(PyExc_BufferError, "granary.Sample: no buffer");
    return -1;
  }
  if (sample->released()) {
    const std::string message = "granary sample " + std::to_string(sample->view().id) +
                                " was released; its bytes may have been reused";
    PyErr_SetString(PyExc_ValueError, message.c_str());
    return -1;
  }
  // Read-only: a request for a writable buffer fails with BufferError.
  if (PyBuffer_FillInfo(view, obj, const_cast<char*>(sample->view().data),
                        static_cast<Py_ssize_t>(sample->view().size), 1, flags) != 0) {
    return -1;
  }
  sample->AddExport();
  return 0;
}

void SampleReleaseBuffer(PyObject* obj, Py_buffer*) {
  try {
    py::handle(obj).cast<PySample*>()->RemoveExport();
  } catch (...) {
  }
}

py::bytes BytesOf(const SampleView& view) {
  return py::bytes(view.data, static_cast<size_t>(view.size));
}

std::vector<uint32_t> CheckedIds(const std::vector<int64_t>& ids) {
  std::vector<uint32_t> out;
  out.reserve(ids.size());
  for (int64_t id : ids) {
    if (id < 0 || id > int64_t{0xffffffff}) {
      throw py::index_error("sample id " + std::to_string(id) + " is out of range");
    }
    out.push_back(static_cast<uint32_t>(id));
  }
  return out;
}

// One sample, pinned. A hint already in the session's table is taken with
// the GIL held (no I/O; releasing and taking back the GIL would cost more
// than the lookup); anything else is a GET with the GIL released.
SampleView GetOne(Session& s, int64_t id) {
  if (id < 0 || id > int64_t{0xffffffff}) {
    throw py::index_error("sample id " + std::to_string(id) + " is out of range");
  }
  const auto sample = static_cast<uint32_t>(id);
  if (std::optional<SampleView> hinted = s.TryGetHinted(sample)) return *hinted;
  Result<SampleView> view = [&] {
    py::gil_scoped_release release;
    return s.Get(sample);
  }();
  return ValueOrThrow(std::move(view));
}

SamplerSpec MakeSamplerSpec(uint64_t n, uint64_t seed, uint64_t epoch, uint32_t num_replicas,
                            uint32_t rank, bool shuffle, bool drop_last) {
  SamplerSpec spec;
  spec.sample_count = n;
  spec.seed = seed;
  spec.epoch = epoch;
  spec.num_replicas = num_replicas;
  spec.rank = rank;
  spec.shuffle = shuffle;
  spec.drop_last = drop_last;
  return spec;
}

void DefineModule(py::module_& m) {
  m.doc() = "libgranary-client binding (see the granary package)";

  static py::exception<StatusError> error_type(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      PyObject* type = error_type.ptr();
      switch (e.status().code()) {
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
      if (type == error_type.ptr()) {
        py::object exc = py::handle(error_type.ptr())(e.what());
        exc.attr("code") = std::string(StatusCodeName(e.status().code()));
        PyErr_SetObject(type, exc.ptr());
      } else {
        PyErr_SetString(type, e.what());
      }
    }
  });

  py::class_<PySample>(m, "Sample", py::buffer_protocol(),
                       "A sample's bytes in the sidecar's shared memory (zero-copy, read-only).")
      .def_property_readonly("id", [](const PySample& s) { return s.view().id; })
      .def_property_readonly("size", [](const PySample& s) { return s.view().size; })
      .def_property_readonly("checksum", [](const PySample& s) { return s.view().checksum; })
      .def_property_readonly("released", &PySample::released)
      .def("release", &PySample::Release,
           "Unpins the sample; its memory may be reused by the sidecar afterwards. "
           "BufferError while a memoryview or numpy array of it is alive.")
      .def("tobytes",
           [](const PySample& s) {
             s.CheckNotReleased();
             return BytesOf(s.view());
           })
      .def("__bytes__",
           [](const PySample& s) {
             s.CheckNotReleased();
             return BytesOf(s.view());
           })
      .def("__len__", [](const PySample& s) { return static_cast<size_t>(s.view().size); })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PySample& s, const py::object&, const py::object&, const py::object&) {
             s.Release();
             return false;
           })
      .def("__eq__",
           [](const PySample& s, const py::object& other) -> py::object {
             if (!PyObject_CheckBuffer(other.ptr()))
               return py::reinterpret_borrow<py::object>(Py_NotImplemented);
             s.CheckNotReleased();
             py::buffer_info info = py::reinterpret_borrow<py::buffer>(other).request();
             if (info.itemsize != 1 || info.ndim != 1) return py::bool_(false);
             const auto size = static_cast<size_t>(info.size);
             return py::bool_(size == s.view().size &&
                              std::string_view(static_cast<const char*>(info.ptr), size) ==
                                  s.view().bytes());
           })
      .def("__reduce__",
           [](const PySample& s) {
             // Pickles (e.g. from a DataLoader worker) as a copy of the bytes.
             s.CheckNotReleased();
             return py::make_tuple(py::module_::import("builtins").attr("bytes"),
                                   py::make_tuple(BytesOf(s.view())));
           })
      .def("__repr__", [](const PySample& s) {
        return "<granary.Sample id=" + std::to_string(s.view().id) +
               " size=" + std::to_string(s.view().size) + (s.released() ? " released>" : ">");
      });
  {
    // Our own buffer slots (see SampleGetBuffer); py::buffer_protocol() gave
    // the type its buffer table.
    auto* type = reinterpret_cast<PyTypeObject*>(m.attr("Sample").ptr());
    type->tp_as_buffer->bf_getbuffer = SampleGetBuffer;
    type->tp_as_buffer->bf_releasebuffer = SampleReleaseBuffer;
  }
  // Hash by identity: __eq__ compares bytes, but a pinned view is not a value.
  m.attr("Sample").attr("__hash__") = py::none();

  py::class_<Session, std::shared_ptr<Session>>(m, "Session",
                                                "A session with the sidecar on one dataset.")
      .def(py::init([](const std::string& dataset, const std::string& socket,
                       const std::string& client_name, double connect_timeout, double call_timeout,
                       uint32_t lookahead, bool verify_checksums) {
             SessionOptions options;
             options.socket_path = socket;
             options.client_name = client_name;
             options.connect_timeout = Millis(connect_timeout, "connect_timeout");
             options.call_timeout = Millis(call_timeout, "call_timeout");
             options.lookahead = lookahead;
             options.verify_checksums = verify_checksums;
             Result<std::unique_ptr<Session>> session = [&] {
               py::gil_scoped_release release;
               return Session::Open(dataset, options);
             }();
             return std::shared_ptr<Session>(ValueOrThrow(std::move(session)));
           }),
           py::arg("dataset"), py::arg("socket") = "", py::arg("client_name") = "",
           py::arg("connect_timeout") = 10.0, py::arg("call_timeout") = 120.0,
           py::arg("lookahead") = 64, py::arg("verify_checksums") = false)
      .def_property_readonly("name", [](const Session& s) { return s.info().name; })
      .def_property_readonly("manifest_id",
                             [](const Session& s) { return s.info().manifest_id.ToHex(); })
      .def_property_readonly("sample_count", [](const Session& s) { return s.info().sample_count; })
      .def_property_readonly("total_bytes", [](const Session& s) { return s.info().total_bytes; })
      .def_property_readonly("chunk_count", [](const Session& s) { return s.info().chunk_count; })
      .def_property_readonly("socket_path", &Session::socket_path)
      .def_property_readonly("sidecar_name", &Session::sidecar_name)
      .def_property_readonly("arena_bytes", &Session::arena_bytes)
      .def_property_readonly("pid", &Session::pid)
      .def_property_readonly("pinned_count", &Session::pinned_count)
      .def_property_readonly("hint_count", &Session::hint_count)
      .def("in_opening_process", &Session::InOpeningProcess)
      .def(
          "read",
          [](Session& s, int64_t id) {
            SampleView v = GetOne(s, id);
            py::bytes bytes = BytesOf(v);
            s.Release(v);
            return bytes;
          },
          py::arg("id"), "The sample's bytes (a copy; the pin is released at once).")
      .def(
          "read_many",
          [](Session& s, const std::vector<int64_t>& ids) {
            std::vector<uint32_t> checked = CheckedIds(ids);
            std::vector<Result<SampleView>> views = [&] {
              py::gil_scoped_release release;
              return s.GetMany(checked);
            }();
            py::list out;
            const Status* first_error = nullptr;
            for (const Result<SampleView>& v : views) {
              if (!v.ok()) {
                if (first_error == nullptr) first_error = &v.status();
                continue;
              }
              if (first_error == nullptr) out.append(BytesOf(*v));
              s.Release(*v);
            }
            if (first_error != nullptr) Throw(*first_error);
            return out;
          },
          py::arg("ids"), "Each sample's bytes (copies), in one round trip where possible.")
      .def(
          "get",
          [](const std::shared_ptr<Session>& s, int64_t id) {
            return std::make_unique<PySample>(s, GetOne(*s, id));
          },
          py::arg("id"), "The sample in shared memory (zero-copy), pinned until released.")
      .def(
          "get_many",
          [](const std::shared_ptr<Session>& s, const std::vector<int64_t>& ids) {
            std::vector<uint32_t> checked = CheckedIds(ids);
            std::vector<Result<SampleView>> views = [&] {
              py::gil_scoped_release release;
              return s->GetMany(checked);
            }();
            const Status* first_error = nullptr;
            for (const Result<SampleView>& v : views) {
              if (!v.ok() && first_error == nullptr) first_error = &v.status();
            }
            if (first_error != nullptr) {
              for (const Result<SampleView>& v : views) {
                if (v.ok()) s->Release(*v);
              }
              Throw(*first_error);
            }
            py::list out;
            for (const Result<SampleView>& v : views) {
              out.append(py::cast(std::make_unique<PySample>(s, *v)));
            }
            return out;
          },
          py::arg("ids"))
      .def(
          "announce_sampler",
          [](Session& s, uint64_t seed, uint64_t epoch, uint32_t num_replicas, uint32_t rank,
             bool shuffle, bool drop_last, uint64_t start_position) {
            SamplerSpec spec = MakeSamplerSpec(s.info().sample_count, seed, epoch, num_replicas,
                                               rank, shuffle, drop_last);
            sp::SetPlan plan = ValueOrThrow(SamplerSetPlan(spec, start_position));
            py::gil_scoped_release release;
            ThrowIfError(s.SetPlan(plan));
          },
          py::arg("seed"), py::arg("epoch"), py::arg("num_replicas"), py::arg("rank"),
          py::arg("shuffle"), py::arg("drop_last"), py::arg("start_position") = 0,
          "SET_PLAN for a DistributedSampler over all of the dataset's samples.")
      .def(
          "set_plan",
          [](Session& s, const std::string& plan_id, uint64_t seed, uint64_t epoch,
             uint32_t world_size, uint32_t rank, uint32_t batch_size, bool drop_last,
             const std::string& mode, uint32_t window_chunks, uint64_t start_position) {
            sp::SetPlan plan;
            plan.plan_id = plan_id;
            plan.seed = seed;
            plan.epoch = epoch;
            plan.world_size = world_size;
            plan.rank = rank;
            plan.batch_size = batch_size;
            plan.drop_last = drop_last;
            plan.mode = static_cast<uint8_t>(ValueOrThrow(ParsePlanMode(mode)));
            plan.window_chunks = window_chunks;
            plan.start_position = start_position;
            py::gil_scoped_release release;
            ThrowIfError(s.SetPlan(plan));
          },
          py::arg("plan_id"), py::arg("seed"), py::arg("epoch"), py::arg("world_size"),
          py::arg("rank"), py::arg("batch_size") = 1, py::arg("drop_last") = false,
          py::arg("mode") = "global", py::arg("window_chunks") = kDefaultChunkWindow,
          py::arg("start_position") = 0)
      .def(
          "next",
          [](const std::shared_ptr<Session>& s, uint32_t max) {
            bool end_of_epoch = false;
            Result<std::vector<Result<SampleView>>> got = [&] {
              py::gil_scoped_release release;
              return s->Next(max, &end_of_epoch);
            }();
            std::vector<Result<SampleView>> views = ValueOrThrow(std::move(got));
            py::list out;
            for (Result<SampleView>& v : views) {
              if (v.ok()) {
                out.append(py::cast(std::make_unique<PySample>(s, *v)));
              } else {
                out.append(py::none());
              }
            }
            return py::make_tuple(out, end_of_epoch);
          },
          py::arg("max") = 1,
          "The plan's next samples and whether the epoch ended (None for a failed sample).")
      .def("flush",
           [](Session& s) {
             py::gil_scoped_release release;
             ThrowIfError(s.Flush());
           })
      .def("ping",
           [](Session& s) {
             py::gil_scoped_release release;
             ThrowIfError(s.Ping());
           })
      .def(
          "stat",
          [](Session& s, int64_t id) {
            std::vector<uint32_t> ids = CheckedIds({id});
            Result<sp::StatEntry> entry = [&] {
              py::gil_scoped_release release;
              return s.Stat(ids[0]);
            }();
            sp::StatEntry e = ValueOrThrow(std::move(entry));
            return py::make_tuple(e.path, e.size, e.mtime_ns);
          },
          py::arg("id"), "(path, size, mtime_ns) from the manifest.")
      .def(
          "paths",
          [](Session& s, uint32_t first, uint32_t count) {
            Result<std::vector<sp::StatEntry>> entries = [&] {
              py::gil_scoped_release release;
              return s.List(first, count);
            }();
            std::vector<std::string> out;
            for (sp::StatEntry& e : ValueOrThrow(std::move(entries))) {
              out.push_back(std::move(e.path));
            }
            return out;
          },
          py::arg("first"), py::arg("count"), "Paths of ids [first, first + count).")
      .def(
          "directories",
          [](Session& s) {
            Result<std::vector<sp::DirectoryItem>> dirs = [&] {
              py::gil_scoped_release release;
              return s.Directories();
            }();
            py::list out;
            for (const sp::DirectoryItem& d : ValueOrThrow(std::move(dirs))) {
              out.append(py::make_tuple(d.path, d.mode));
            }
            return out;
          },
          "[(path, mode)] of every directory but the root, sorted by path.")
      .def_property_readonly("protocol_version", &Session::protocol_version)
      .def(
          "lookup",
          [](Session& s, const std::string& path) {
            Result<uint32_t> id = [&] {
              py::gil_scoped_release release;
              return s.Lookup(path);
            }();
            return ValueOrThrow(std::move(id));
          },
          py::arg("path"), "The id of a path relative to the dataset root.");

  m.def(
      "rank_samples",
      [](uint64_t n, uint64_t seed, uint64_t epoch, uint32_t num_replicas, uint32_t rank,
         bool shuffle, bool drop_last) {
        SamplerSpec spec = MakeSamplerSpec(n, seed, epoch, num_replicas, rank, shuffle, drop_last);
        Result<std::vector<SampleId>> ids = [&] {
          py::gil_scoped_release release;
          return SamplerIndices(spec);
        }();
        return ValueOrThrow(std::move(ids));
      },
      py::arg("n"), py::arg("seed"), py::arg("epoch"), py::arg("num_replicas"), py::arg("rank"),
      py::arg("shuffle"), py::arg("drop_last"),
      "The indices DistributedSampler(rank) yields in an epoch (granary's plan code).");
  m.def(
      "rank_share",
      [](uint64_t n, uint32_t num_replicas, bool drop_last) {
        if (num_replicas == 0) throw py::value_error("num_replicas must be at least 1");
        RankShare share = ComputeRankShare(n, num_replicas, drop_last);
        return py::make_tuple(share.num_samples, share.total_size);
      },
      py::arg("n"), py::arg("num_replicas"), py::arg("drop_last"),
      "(num_samples, total_size) as DistributedSampler computes them.");
  m.def("validate_sample_path",
        [](const std::string& path) { ThrowIfError(ValidateSamplePath(path)); });
  m.def("resolve_socket_path",
        [](const std::string& configured) { return ResolveSocketPath(configured); });
}

}  // namespace
}  // namespace granary::client

PYBIND11_MODULE(_native, m) { granary::client::DefineModule(m); }
