#pragma once
// What this build of lathe_kernels can do on this machine: which CPU instruction sets the
// dispatcher may use and whether CUDA kernels were compiled in and have a device to run on.

#include <string>

namespace lathe::kernels {

// CPU code paths. Every op has a Scalar reference; the SIMD paths must give bit-identical
// results and are only chosen when the CPU (and OS) support them.
// Avx512 means AVX512F + AVX512BW.
enum class CpuIsa { Scalar, Avx2, Avx512 };

// "scalar", "avx2", "avx512".
const char* cpuIsaName(CpuIsa isa) noexcept;

// True when this CPU can run the given code path (Scalar is always available).
bool cpuIsaAvailable(CpuIsa isa) noexcept;

// The widest available path; what the dispatching entry points use. Setting the environment
// variable LATHE_KERNELS_ISA=scalar|avx2|avx512 caps it (read once), for A/B debugging.
CpuIsa bestCpuIsa() noexcept;

// Space-separated list of detected CPU features relevant to the kernels, for logs and
// `lathectl` diagnostics, e.g. "sse4.2 avx avx2 fma avx512f avx512bw avx512vl avx512vnni".
std::string cpuFeatures();

// True when the library was built with LATHE_WITH_CUDA (the toolkit was found at configure).
bool cudaCompiled() noexcept;

// Number of usable CUDA devices; 0 when CUDA is not compiled in, no driver is installed or
// no GPU is present. Never throws.
int cudaDeviceCount() noexcept;

}  // namespace lathe::kernels
