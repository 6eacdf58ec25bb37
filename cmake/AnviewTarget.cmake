# Warnings, sanitizers and the version define that every target of ours gets.
set(ANVIEW_SANITIZE "" CACHE STRING "Sanitizers: '', 'address' (ASan+UBSan) or 'thread' (TSan)")
# ANVIEW_FUZZ: the fuzz targets with libFuzzer (clang only; scripts/fuzz.sh). Every target of
# ours is then built with coverage for the fuzzer and ASan+UBSan.
option(ANVIEW_FUZZ "Build the fuzz targets with libFuzzer (needs clang)" OFF)
if(ANVIEW_FUZZ AND NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "ANVIEW_FUZZ=ON needs clang (-DCMAKE_CXX_COMPILER=clang++)")
endif()

function(anview_target_options target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror -Wshadow -Wnon-virtual-dtor
                         # Designated initializers (our options structs) leave fields at their
                         # defaults on purpose.
                         -Wno-missing-field-initializers)
  if(CMAKE_UNITY_BUILD AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # A unity build includes every source into a generated one, so GCC takes each for a
    # header and warns about a class of ours that holds a type from the file's anonymous
    # namespace. The warning is for headers; the build without unity keeps it.
    target_compile_options(${target} PRIVATE -Wno-subobject-linkage)
  endif()
  if(ANVIEW_FUZZ)
    target_compile_options(${target} PRIVATE -fsanitize=fuzzer-no-link,address,undefined
                                             -fno-sanitize-recover=all -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  elseif(ANVIEW_SANITIZE STREQUAL "address")
    # GCC 12 reports false maybe-uninitialized warnings inside libstdc++ (<regex>,
    # std::function) when ASan instrumentation meets -O2; the Release build keeps the warning.
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer
                                             -fno-sanitize-recover=all -Wno-maybe-uninitialized)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
    # Programs are linked as fixed-address executables: a position-independent one spends a
    # quarter of its start-up applying relocations (ASan's global descriptors add many), and
    # the test suite starts about two thousand of them: 150 -> 118 ms per start of
    # anview_p2p_check.
    target_link_options(${target} PRIVATE
                        $<$<STREQUAL:$<TARGET_PROPERTY:${target},TYPE>,EXECUTABLE>:-no-pie>)
  elseif(ANVIEW_SANITIZE STREQUAL "thread")
    target_compile_options(${target} PRIVATE -fsanitize=thread -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=thread)
  elseif(NOT ANVIEW_SANITIZE STREQUAL "")
    message(FATAL_ERROR "ANVIEW_SANITIZE must be '', 'address' or 'thread'")
  endif()
endfunction()

# Test programs are glue around the library under test. Those built with gtest build at -O0
# (the library keeps the build's optimization): a gtest+json test file compiles a third
# faster (one_sided_test.cpp: 17.9 s at -O3, 11.5 s at -O0; under ASan+UBSan 15.8 s at -O1,
# 9.9 s at -O0), and the test binaries are half of what CI compiles. Not under TSan: there
# -O0 saves a tenth of the compile and the unit tests run 10 % longer (every stack access of
# the tests' own code is instrumented). Programs that move and check data in bulk
# (anview_p2p_check, the lab programs) say OPTIMIZED and keep the build's optimization.
# In the ASan+UBSan build every test program's own code gets ASan only (10.1 -> 7.6 s for
# one_sided_test.cpp at -O0): UBSan's checks are for the library, which keeps them.
function(anview_test_target_options target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "OPTIMIZED" "" "")
  anview_target_options(${target})
  if(NOT arg_OPTIMIZED AND NOT ANVIEW_SANITIZE STREQUAL "thread")
    target_compile_options(${target} PRIVATE -O0)
  endif()
  if(ANVIEW_SANITIZE STREQUAL "address" AND NOT ANVIEW_FUZZ)
    target_compile_options(${target} PRIVATE -fno-sanitize=undefined)
  endif()
endfunction()
