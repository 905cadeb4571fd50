#pragma once
// Recording runs in the workspace: a run trained here (in this process or in local worker
// processes) or an event stream from elsewhere becomes a run in the store (training/record.cpp).
#include <atomic>
#include <cstdint>
#include <functional>
#include <istream>
#include <string>

#include "lathe/core/events.h"
#include "lathe/core/launcher.h"
#include "lathe/core/run_spec.h"
#include "lathe/core/trainer.h"

namespace lathe::core {

class Store;

struct RecordedRun {
    int64_t runId = 0;
    TrainResult result;
};

struct RecordOptions {
    int64_t resumeRunId = 0;  // continue this run from its last checkpoint
    std::string host = "localhost";
    const std::atomic<bool>* stop = nullptr;
    /// Called (on the training thread) once the run exists in the store, before any event.
    std::function<void(int64_t runId)> onRunCreated;
    /// spec.nproc > 1: the lathectl that runs the workers (empty: next to this executable).
    std::string workerProgram;
    /// spec.nproc > 1: what starts and supervises the ranks; empty: launchLocal (this machine).
    /// lathe::remote::launchRemote plugs in here for runs across hosts.
    std::function<LaunchResult(const LaunchOptions&, const EventSink&)> launch;
    /// Where the ranks run, recorded with the run ("gpu-a:2,gpu-b:2"); empty: this machine.
    std::string placement;
    /// data = "dataset:...": check every file's hash (and the stored copies) before training,
    /// not only sizes and mtimes.
    bool verifyData = false;
};

/// Creates (or resumes) a run in the store, trains, records every event, and sets the final
/// status. `observer` (may be empty) sees every event too, e.g. for progress or live plots.
/// Never throws for training failures: the run is recorded as failed and the result says so.
/// Throws ConfigError for an invalid spec before creating a run.
RecordedRun trainAndRecord(Store& store, const RunSpec& spec, const RecordOptions& options,
                           const EventSink& observer = {});

struct IngestResult {
    int64_t runId = 0;
    RunStatus status = RunStatus::Created;
    std::string error;
};

/// Records an event stream (from `lathectl worker` on a pipe or a saved file) as a new
/// run. The stream must start with a Run record. Everything up to a malformed line or an
/// early end is kept; the run is then marked failed with the reason. Throws EventStreamError
/// only when the stream has no usable Run record (nothing is recorded then).
IngestResult ingestEventStream(Store& store, std::istream& in, const EventSink& observer = {});

/// Writes one event into the store for `runId` (metrics, logs, status, artifacts).
void recordEvent(Store& store, int64_t runId, const Event& e);

}  // namespace lathe::core
