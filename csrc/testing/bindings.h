// Test hooks of the extension module, kept off its public surface: torchfeed._C._testing.
#pragma once

#include <torch/extension.h>

namespace torchfeed::testing {

// Adds the submodule `_testing` to `m`.
void bind(pybind11::module_& m);

}  // namespace torchfeed::testing
