# Helpers shared by every module so targets are declared one way.

# Compile options for Granary's own code (never for third-party code).
# -Wnull-dereference is left out: GCC 12 at -O2 reports it inside libstdc++.
function(granary_project_options target)
  target_compile_options(${target} PRIVATE
    -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
    -Wcast-align -Wunused -Woverloaded-virtual -Wconversion -Wsign-conversion
    -Wdouble-promotion -Wformat=2 -Wimplicit-fallthrough)
  if(GRANARY_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# granary_add_test(<name> SOURCES <files...> [LIBS <libs...>] [LABEL <label>]
#                  [PROCESSORS n])  (n: the cores a case takes; ctest runs it with no more beside it)
# One executable per test file; every GoogleTest case becomes a CTest test.
# Its label (one: gtest_discover_tests cannot take a list) says what it needs:
# by default `integration` for a file under integration/ (it starts processes)
# and `unit` for any other (`make check` runs these); `python`, `store` or
# `kubernetes` where a suite says so.
function(granary_add_test name)
  cmake_parse_arguments(ARG "" "PROCESSORS;LABEL" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  granary_project_options(${name})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} granary::testing GTest::gmock_main)
  set(props TIMEOUT 300)
  if(NOT ARG_LABEL)
    list(GET ARG_SOURCES 0 first)
    if(first MATCHES "^integration/")
      set(ARG_LABEL integration)
    else()
      set(ARG_LABEL unit)
    endif()
  endif()
  list(APPEND props LABELS ${ARG_LABEL})
  if(ARG_PROCESSORS)
    list(APPEND props PROCESSORS ${ARG_PROCESSORS})
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES ${props})
endfunction()
