// SPDX-License-Identifier: BSD-3-Clause
// A C++ user of the core: links against it through xhc.h alone (the
// header's extern "C"), and meets its refusals of bad arguments.
#include <cstdio>

#include "xhc.h"

static int failures;

static void expect(bool ok, const char *what)
{
    if (!ok) {
        std::printf("failed: %s\n", what);
        failures++;
    }
}

int main()
{
    expect(xhc_dtype_size(XHC_FLOAT64) == 8, "float64 is 8 bytes");
    expect(xhc_op_valid(XHC_INT32, XHC_BXOR) == 1, "BXOR on int32");
    expect(xhc_op_valid(XHC_FLOAT32, XHC_BXOR) == 0, "no BXOR on float32");
    expect(xhc_barrier(nullptr) == XHC_ERR_FREED, "no context: FREED");

    xhc_call_t call = {};
    call.kind = XHC_BARRIER;
    call.flags = 1 << 30;  // a bit the core keeps for itself
    expect(xhc_run(&call) == XHC_ERR_ARG, "xhc_run refuses unknown flags");
    call.flags = 0;
    expect(xhc_run(&call) == XHC_ERR_FREED, "xhc_run of no context");

    double in[3] = {1, 2, 3}, acc[3] = {10, 20, 30};
    expect(xhc_fold_into(acc, in, 3, XHC_FLOAT64, XHC_SUM) == 0
           && acc[2] == 33, "fold SUM");
    if (failures == 0)
        std::printf("ok\n");
    return failures != 0;
}
