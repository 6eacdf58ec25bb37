# The Python package and the PyTorch backend (python/), built where their Debian packages are:
#   pybind11-dev + python3-dev          -> build/python/anview (import anview)
#   + python3-torch and libtorch-dev    -> anview.torch (the "anview" c10d backend)
# ANVIEW_PYTHON / ANVIEW_TORCH: AUTO (build when found), ON (fail when missing) or OFF. Not
# built under sanitizers: the interpreter would need the sanitizer runtime preloaded.
set(ANVIEW_PYTHON AUTO CACHE STRING "Build the Python package: AUTO, ON or OFF")
set(ANVIEW_TORCH AUTO CACHE STRING "Build the PyTorch backend: AUTO, ON or OFF")
set(ANVIEW_PYTHON_EXECUTABLE /usr/bin/python3 CACHE FILEPATH
    "The Python the package is built for (Debian's, which sees python3-torch and numpy)")

if(ANVIEW_PYTHON STREQUAL "OFF" OR NOT ANVIEW_SANITIZE STREQUAL "")
  set(ANVIEW_TORCH OFF)
  return()
endif()

set(Python_EXECUTABLE ${ANVIEW_PYTHON_EXECUTABLE})
set(PYBIND11_FINDPYTHON ON)
if(ANVIEW_PYTHON STREQUAL "ON")
  find_package(Python 3 REQUIRED COMPONENTS Interpreter Development.Module)
  find_package(pybind11 CONFIG REQUIRED)
else()
  find_package(Python 3 QUIET COMPONENTS Interpreter Development.Module)
  find_package(pybind11 CONFIG QUIET)
  if(NOT Python_FOUND OR NOT pybind11_FOUND)
    message(STATUS "Anview: no Python package (needs pybind11-dev and python3-dev)")
    set(ANVIEW_TORCH OFF)
    return()
  endif()
endif()

if(NOT ANVIEW_TORCH STREQUAL "OFF")
  # Debian's layout: headers in /usr/include/torch, libraries in the multiarch directory.
  find_path(ANVIEW_TORCH_INCLUDE_DIR torch/csrc/distributed/c10d/ProcessGroup.hpp)
  foreach(lib torch torch_cpu c10 torch_python)
    find_library(ANVIEW_TORCH_LIB_${lib} ${lib})
    list(APPEND ANVIEW_TORCH_LIBRARIES ${ANVIEW_TORCH_LIB_${lib}})
  endforeach()
  # The pybind11 ABI tags torch was built with: the backend's types must be torch's own.
  execute_process(
    COMMAND ${Python_EXECUTABLE} -c
            "import torch; print(';'.join(getattr(torch._C, '_PYBIND11_' + n) for n in ('COMPILER_TYPE', 'STDLIB', 'BUILD_ABI')))"
    OUTPUT_VARIABLE ANVIEW_TORCH_PYBIND11_ABI OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_QUIET RESULT_VARIABLE torch_import)
  if(ANVIEW_TORCH_INCLUDE_DIR AND ANVIEW_TORCH_LIB_torch AND ANVIEW_TORCH_LIB_torch_python
     AND torch_import EQUAL 0)
    set(ANVIEW_TORCH ON)
  elseif(ANVIEW_TORCH STREQUAL "ON")
    message(FATAL_ERROR "ANVIEW_TORCH=ON needs python3-torch and libtorch-dev")
  else()
    message(STATUS "Anview: no PyTorch backend (needs python3-torch and libtorch-dev)")
    set(ANVIEW_TORCH OFF)
  endif()
endif()

add_subdirectory(python)
