// python/src/module.cpp: the extension module dcr._dcr: its version, the translation of
// dcr::error into the dcr.Error hierarchy, and the parts bound by the other files.
#include <nanobind/stl/string.h>

#include <array>
#include <string>

#include "common.hpp"
#include "dcr/version.hpp"

namespace dcr_py {
namespace {

// Python class names of the error codes, by code value (dcr::errc is stable and appended to).
constexpr std::array<const char*, 24> error_class_names = {
    nullptr,                   // ok
    "InvalidArgument",         // 1
    "ShapeMismatch",           // 2
    "DtypeMismatch",           // 3
    "OutOfRange",              // 4
    "CorruptPayload",          // 5
    "TruncatedPayload",        // 6
    "UnsupportedVersion",      // 7
    "ReservedBitsSet",         // 8
    "StalePayload",            // 9
    "DuplicatePayload",        // 10
    "UnknownTensor",           // 11
    "UnsupportedLoaderPath",   // 12
    "CommitConflict",          // 13
    "TransportFailure",        // 14
    "IoError",                 // 15
    "VerificationFailed",      // 16
    "FencedAttempt",           // 17
    "NotReady",                // 18
    "Overflow",                // 19
    "DeviceError",             // 20
    "RegistryMismatch",        // 21
    "ControlPlaneUnavailable", // 22
    "DeadlineExceeded",        // 23
};

PyObject* error_base = nullptr;
std::array<PyObject*, error_class_names.size()> error_classes{};

void raise_dcr_error(const dcr::error& e) {
  const auto code = static_cast<std::size_t>(e.code().value());
  PyObject* cls = code < error_classes.size() && error_classes[code] ? error_classes[code]
                                                                     : error_base;
  PyErr_SetString(cls, e.what());
}

}  // namespace
}  // namespace dcr_py

NB_MODULE(_dcr, m) {
  using namespace dcr_py;
  m.doc() = "dcr: bit-exact delta-compressed refit (the C++ library's bindings; use `import dcr`)";
  m.attr("__version__") = DCR_VERSION_STRING;

  // dcr.Error and one subclass per dcr::errc (the codes are the C++ ones, stable).
  error_base = PyErr_NewExceptionWithDoc(
      "dcr.Error",
      "Base of every error dcr raises. `code` is the stable dcr::errc value, `code_name` its name.",
      PyExc_Exception, nullptr);
  PyObject_SetAttrString(error_base, "code", PyLong_FromLong(0));
  m.attr("Error") = nb::handle(error_base);
  for (std::size_t c = 1; c < error_class_names.size(); ++c) {
    const std::string qualified = std::string("dcr.") + error_class_names[c];
    const std::string doc = "dcr::errc " + std::to_string(c) + ": " +
                            dcr::error_category().message(static_cast<int>(c));
    // Bad arguments (codes 1-4) are ValueErrors too, so generic callers catch them as such.
    PyObject* bases = c <= 4 ? PyTuple_Pack(2, error_base, PyExc_ValueError) : nullptr;
    PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc.c_str(),
                                              bases ? bases : error_base, nullptr);
    Py_XDECREF(bases);
    PyObject_SetAttrString(cls, "code", PyLong_FromSize_t(c));
    error_classes[c] = cls;
    m.attr(error_class_names[c]) = nb::handle(cls);
  }
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const dcr::error& e) {
      raise_dcr_error(e);
    }
  });
  m.def("error_message", [](int code) { return dcr::error_category().message(code); },
        nb::arg("code"), "The library's message for a dcr::errc value.");

  bind_core(m);
  bind_owner(m);
  bind_receiver(m);
  bind_protocol(m);
  bind_io(m);
  bind_baseline(m);
}
