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
  elseif(ANVIEW_SANITIZE STREQUAL "thread")
    target_compile_options(${target} PRIVATE -fsanitize=thread -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=thread)
  elseif(NOT ANVIEW_SANITIZE STREQUAL "")
    message(FATAL_ERROR "ANVIEW_SANITIZE must be '', 'address' or 'thread'")
  endif()
endfunction()
