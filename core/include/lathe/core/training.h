#pragma once
// Training facade. No LibTorch types cross this header: the trainer takes a RunSpec and
// reports everything through the event stream.
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "lathe/core/distributed.h"
#include "lathe/core/events.h"
#include "lathe/core/run_spec.h"

namespace lathe::core {

class Store;

struct TrainOptions {
    std::string checkpointDir;            // empty = no checkpoints
    std::string resumeFrom;               // checkpoint file to continue from; empty = fresh
    const std::atomic<bool>* stop = nullptr;  // set to request a clean stop after the current step
    DistEnv dist;                         // this process's rank when it is one of several
};

struct TrainResult {
    std::string status;                   // "completed" | "stopped" | "failed"
    std::string error;                    // for "failed"
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

struct RecordedRun {
    int64_t runId = 0;
    TrainResult result;
};

struct RecordOptions {
    int64_t resumeRunId = 0;              // continue this run from its last checkpoint
    std::string host = "localhost";
    const std::atomic<bool>* stop = nullptr;
    /// Called (on the training thread) once the run exists in the store, before any event.
    std::function<void(int64_t runId)> onRunCreated;
    /// spec.nproc > 1: the lathectl that runs the workers (empty: next to this executable).
    std::string workerProgram;
};

/// Creates (or resumes) a run in the store, trains, records every event, and sets the final
/// status. `observer` (may be empty) sees every event too, e.g. for progress or live plots.
/// Never throws for training failures: the run is recorded as failed and the result says so.
/// Throws ConfigError for an invalid spec before creating a run.
RecordedRun trainAndRecord(Store& store, const RunSpec& spec, const RecordOptions& options,
                           const EventSink& observer = {});

struct IngestResult {
    int64_t runId = 0;
    std::string status;
    std::string error;
};

/// Records an event stream (from `lathectl worker` on a pipe, a saved file, or SSH) as a new
/// run. The stream must start with a Run record. Everything up to a malformed line or an
/// early end is kept; the run is then marked failed with the reason. Throws EventStreamError
/// only when the stream has no usable Run record (nothing is recorded then).
IngestResult ingestEventStream(Store& store, std::istream& in, const EventSink& observer = {});

/// Writes one event into the store for `runId` (metrics, logs, status, artifacts).
void recordEvent(Store& store, int64_t runId, const Event& e);

}  // namespace lathe::core
