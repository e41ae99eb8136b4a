// Include (after the other includes) in a file whose fp32 expressions must round every operation
// on its own, as the reference's separate tensor ops do: no fusing of a * b + c into an FMA.
// The build already passes -ffp-contract=off; this keeps such files exact when compiled by other
// means (a different build system, -march=native experiments).
#pragma once

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
