# Every dependency comes from Debian 12's packages (scripts/install-deps).
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(SQLite3 REQUIRED)
# Logging and formatting as core links them: the shared libraries, except in the
# Python module, which compiles both from their headers so that a wheel needs
# neither installed.
set(GRANARY_LOG_LIBS spdlog::spdlog fmt::fmt)

if(GRANARY_PYTHON_MODULE_ONLY)
  set(GRANARY_LOG_LIBS spdlog::spdlog_header_only fmt::fmt-header-only)
  # The Python module (a wheel) carries zstd in itself (its static archive),
  # and xxHash inline (core/src/hash.cc), so it needs neither installed.
  find_library(GRANARY_ZSTD_STATIC NAMES libzstd.a REQUIRED)
  add_library(PkgConfig::ZSTD STATIC IMPORTED)
  set_target_properties(PkgConfig::ZSTD PROPERTIES IMPORTED_LOCATION ${GRANARY_ZSTD_STATIC})
  add_library(PkgConfig::XXHASH INTERFACE IMPORTED)
  add_compile_definitions(GRANARY_XXH3_BASELINE_ONLY)
  return()  # nothing below is linked by core, protocol or client
endif()
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)
find_package(Boost 1.74 REQUIRED)  # header-only Asio, for granary::cachenode's server only

# granary::daemon (the daemons' /metrics, /healthz, /readyz).
# prometheus-cpp ships a CMake config: prometheus-cpp::core is the registry,
# metric types and text exposition.
find_package(prometheus-cpp CONFIG REQUIRED)
# cpp-httplib: Debian builds it as a library (libcpp-httplib.so) with OpenSSL,
# zlib and brotli support, and its pkg-config file carries the matching
# -DCPPHTTPLIB_* flags, which must agree with that build (they change class
# layouts). Hence pkg-config rather than the bare header.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)

if(GRANARY_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
# CLI11: the daemons' and tools' command lines.
find_package(CLI11 REQUIRED)
if(GRANARY_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
