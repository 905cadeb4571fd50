#pragma once
// c10d behind DistContext (private to distributed/: the process group itself, shared by the
// context and the reducer). Compiled with USE_C10D_GLOO (and USE_C10D_NCCL when available).
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <string>

#include "distributed/process_group.h"

namespace lathe::core {

// The process groups' common base: c10d::ProcessGroup in LibTorch 1.x, c10d::Backend in 2.x
// (where ProcessGroup became a wrapper around backends).
#if TORCH_VERSION_MAJOR >= 2
using CommGroup = c10d::Backend;
#else
using CommGroup = c10d::ProcessGroup;
#endif

struct DistContext::Impl {
    c10::intrusive_ptr<c10d::Store> store;
    c10::intrusive_ptr<CommGroup> pg;
    c10::intrusive_ptr<CommGroup> host;     // hierarchical: this host's ranks
    c10::intrusive_ptr<CommGroup> leaders;  // hierarchical: one rank per host (leaders only)
    std::chrono::seconds timeout{60};
    std::string masterAddr;
    std::string bindAddr;  // this host's address for Gloo's sockets
    bool nccl = false;

    // A process group over `store` of the context's kind.
    c10::intrusive_ptr<CommGroup> group(const c10::intrusive_ptr<c10d::Store>& s, int rank, int size) const {
#ifdef USE_C10D_NCCL
        if (nccl) {
            auto opts = c10d::ProcessGroupNCCL::Options::create();
            opts->timeout = timeout;
            return c10::make_intrusive<c10d::ProcessGroupNCCL>(s, rank, size, opts);
        }
#endif
        auto opts = c10d::ProcessGroupGloo::Options::create();
        opts->timeout = timeout;
        opts->devices.push_back(
            c10d::ProcessGroupGloo::createDeviceForHostname(bindAddr.empty() ? masterAddr : bindAddr));
        return c10::make_intrusive<c10d::ProcessGroupGloo>(s, rank, size, opts);
    }
};

}  // namespace lathe::core
