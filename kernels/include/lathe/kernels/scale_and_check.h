#pragma once
// scale_and_check: the fused "unscale and find non-finite" step of a dynamic loss scaler
// (the job of ATen's _amp_foreach_non_finite_check_and_unscale_). Gradients computed on a
// scaled loss are multiplied in place by inv_scale, and the caller learns whether any value
// was inf or NaN, in which case the optimizer step is skipped and the scale is reduced.
//
// A value is flagged when it is non-finite before or after scaling; the latter also catches
// a finite value that overflows because inv_scale > 1, and a non-finite inv_scale.
// Every element is scaled even after a non-finite one is found, as ATen does.
//
// All CPU paths give bit-identical results, NaN payloads included: a NaN input stays that NaN
// (quieted); with a NaN invScale every element becomes NaN, keeping an input NaN's payload
// and otherwise taking invScale's. The CUDA version matches except that GPUs produce their
// canonical NaN instead of propagating payloads.

#include <cstddef>

#include "lathe/kernels/info.h"

namespace lathe::kernels {

// Scales x[0..n) by invScale in place; returns true when any element was non-finite.
// Uses the widest CPU path available (see bestCpuIsa()). x may be unaligned; n may be 0.
bool scaleAndCheck(float* x, std::size_t n, float invScale) noexcept;

// Same, on an explicit code path; used by tests and benchmarks to compare paths. Requesting
// a path this CPU cannot run falls back to Scalar rather than faulting.
bool scaleAndCheck(float* x, std::size_t n, float invScale, CpuIsa isa) noexcept;

namespace cuda {

// Device version. x points at n floats in device memory; foundNonFinite points at one int in
// device memory that is set to 1 when any element is non-finite and is otherwise left
// untouched, so one flag can accumulate over many buffers (zero it first, e.g. with
// deviceMemset). stream is a cudaStream_t passed as void* (nullptr: the default stream).
// The call is asynchronous with respect to the host. Throws CudaError on launch failure or
// when the library was built without CUDA.
void scaleAndCheck(float* x, std::size_t n, float invScale, int* foundNonFinite, void* stream = nullptr);

}  // namespace cuda
}  // namespace lathe::kernels
