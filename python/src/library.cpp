// libanview_py.so: the static layers of Anview linked whole into one shared library, which
// every extension module of the Python package loads, so a process holds one copy of their
// state (settings, log, transports) however many modules it imports. The code comes from the
// archives (python/CMakeLists.txt); a shared library still needs a source file of its own.
#include "anview/anview.hpp"
