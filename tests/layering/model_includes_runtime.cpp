// Must not compile: the model layer cannot see the runtime layer's headers (CMakeLists.txt,
// ds41_layer). The test Layering.UpwardIncludeDoesNotCompile builds this file and expects the
// compiler to report the header as not found.
#include "runtime/engine.h"
