#pragma once
// Training facade. No LibTorch types cross this header: the trainer takes a RunSpec and
// reports everything through the event stream.
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "lathe/core/checkpoint.h"
#include "lathe/core/events.h"
#include "lathe/core/launcher.h"
#include "lathe/core/run_spec.h"
#include "lathe/core/run_status.h"

namespace lathe::core {

struct TrainOptions {
    std::string checkpointDir;                // empty = no checkpoints
    std::string resumeFrom;                   // checkpoint file to continue from; empty = fresh
    const std::atomic<bool>* stop = nullptr;  // set to request a clean stop after the current step
    DistEnv dist;                             // this process's rank when it is one of several
    CheckpointOwner owner;                    // written into every checkpoint (the recording run's)
    std::string dataCacheDir;                 // the disk cache's folder (empty: ~/.cache/lathe/data)
    std::string dataVersion;                  // root hash of the data set version trained on, if any
};

struct TrainResult {
    RunStatus status = RunStatus::Failed;  // Completed, Stopped or Failed
    std::string error;                     // for Failed
    int64_t epochsDone = 0;
    int64_t steps = 0;
    std::map<std::string, double> finalMetrics;
};

/// Checks what validate() cannot: that the device and precision exist on this machine (fp16
/// and device = cuda need a CUDA GPU). Throws ConfigError with a suggestion.
void checkRunnable(const RunSpec& spec);

/// CUDA devices LibTorch can use here (0 on a machine or a LibTorch without CUDA).
int cudaDeviceCount() noexcept;

/// Trains in the calling thread. Config and data errors throw (ConfigError, DataError,
/// CheckpointError) before the first step; failures during training are returned as
/// status "failed" after an Error event.
TrainResult train(const RunSpec& spec, const TrainOptions& options, const EventSink& sink);

/// For a process that exists to train (lathectl train, a distributed worker): glibc keeps the
/// heap it has touched instead of handing its top back to the kernel after every step and mapping
/// each large buffer anew, so a step's tensors are not page-faulted in again at every step
/// (75,000 faults in a 300-epoch digits run without it). Process-wide and for the rest of the
/// process's life, so the workbench, whose heap outlives its runs, does not call it. Idempotent.
void keepHeapForTraining();

}  // namespace lathe::core
