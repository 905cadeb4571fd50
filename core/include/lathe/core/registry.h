#pragma once
// The model registry and everything recorded about serving, in the workspace file beside the
// runs: registered model versions (artifact, checksum, signature, metrics, lineage), aliases such
// as `production`, the deployment history, serving metrics scraped from live servers, and alerts.
//
// Registry writes are rare and must answer synchronously (a new version number), so the
// registry uses its own SQLite connection with short IMMEDIATE transactions instead of the
// Store's batching writer. Safe to use from several processes at once (WAL + busy timeout);
// one Registry object is thread-safe.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lathe/core/error.h"

namespace lathe::core {

/// A registry lookup failed: no such model, version or alias. lathectl exits with 2.
class NotFoundError : public ConfigError {
public:
    using ConfigError::ConfigError;
};

/// One input or output of a model, in the Open Inference Protocol's terms.
struct TensorSpec {
    std::string name;
    std::string datatype = "FP32";  // KServe v2 names: FP32, INT64, ...
    std::vector<int64_t> shape;     // -1 = any size (the batch dimension is always -1)
};

struct ModelSignature {
    std::vector<TensorSpec> inputs;
    std::vector<TensorSpec> outputs;
    std::vector<std::string> classNames;  // output index -> label, when a classifier
};
std::string signatureToJson(const ModelSignature& s);
/// Throws ConfigError when the JSON is not a signature.
ModelSignature signatureFromJson(const std::string& json);

/// NAME, NAME:V or NAME@ALIAS.
struct ModelRef {
    std::string name;
    int64_t version = 0;  // 0 = not given
    std::string alias;    // empty = not given
    std::string str() const;
};
/// Throws ConfigError naming what is wrong ("model reference 'x:' has no version after ':'").
ModelRef parseModelRef(const std::string& text);
/// Model and alias names: [A-Za-z0-9][A-Za-z0-9._-]{0,63}. Throws ConfigError.
void checkModelName(const std::string& name, const char* what = "model name");

struct ModelVersion {
    std::string name;
    int64_t version = 0;
    std::string path;  // the artifact (TorchScript archive with Lathe metadata)
    std::string sha256;
    int64_t sizeBytes = 0;
    ModelSignature signature;
    std::map<std::string, double> metrics;  // e.g. val/accuracy of the run that made it
    int64_t runId = 0;                      // 0 = registered from a file
    std::string data;                       // data set the run trained on
    int64_t parentVersion = 0;
    std::string
        parentModel;  // the parent's model when it is another one (a distilled student); empty = this one
    std::string
        derivation;      // how it was made from the parent, JSON: {"method":"quantize","mode":"dynamic",...}
    std::string report;  // the compression report, JSON (CompressReport); empty when none
    std::string source;  // "run 12" or "file /path/model.pt"
    double createdAt = 0;
    std::vector<std::string> aliases;
};

struct ModelSummary {
    std::string name;
    int64_t versions = 0;
    int64_t latestVersion = 0;
    std::map<std::string, int64_t> aliases;
    double createdAt = 0;
};

/// One span of time during which a version served under a model's deployment.
struct Deployment {
    int64_t id = 0;
    std::string model;
    int64_t version = 0;
    std::string target = "local";  // "local"; later an SSH host
    std::string url;               // http://127.0.0.1:8500
    int64_t pid = 0;               // the server process (local target)
    std::string logPath;
    std::string actor = "user";     // "user" | "auto-rollback" | ...
    std::string action = "deploy";  // "deploy" | "rollback"
    std::string reason;
    double startedAt = 0;
    double endedAt = 0;     // 0 = live
    std::string endReason;  // "replaced by v3", "undeployed", "server exited"
    std::string instance;   // the server's --instance-id nonce (local target; empty before schema 4)
    bool live() const { return endedAt == 0; }
};

struct ServingPoint {
    double t = 0;  // seconds since the Unix epoch
    double value = 0;
    int64_t version = 0;
};

struct AlertRecord {
    int64_t id = 0;
    std::string model;
    std::string rule;  // "p99_latency", "error_rate", "gpu_idle"
    std::string message;
    double value = 0;
    double firedAt = 0;
    double resolvedAt = 0;  // 0 = still firing
};

/// A progressive rollout of a candidate version beside a model's live one (`lathectl rollout`):
/// its plan, and where it stands. Weights are basis points (1/100 of a percent).
struct Rollout {
    int64_t id = 0;
    std::string model;
    int64_t baseline = 0;   // the live version when it started
    int64_t candidate = 0;  // the version rolled out
    // ---- the plan (fixed at start) ----
    std::vector<int32_t> stepsBp{500, 2500, 5000, 10000};
    double intervalS = 600;      // how long each judged window lasts
    double maxErrorRate = 0.01;  // share of requests answered >= 500 the candidate may have
    double maxP99Ms = 0;         // P99 latency limit; 0: only "no slower than the baseline"
    int64_t minRequests = 200;   // per variant and window before anything is judged
    int threshold = 3;           // unhealthy windows in a row before the automatic rollback
    std::string userParameter;   // request parameter naming the user (else X-User-Id)
    std::string candidatePath;   // the candidate's artifact on the server's host (remote servers)
    std::string candidateSha256;
    // ---- where it stands ----
    std::string state = "running";  // running | paused | promoted | rolled_back | aborted | ended
    int step = 0;                   // index into stepsBp
    int32_t weightBp = 0;           // the candidate's share now
    int badInRow = 0;               // unhealthy windows in a row
    std::string actor = "user";
    double startedAt = 0, updatedAt = 0;
    double endedAt = 0;  // 0 = running or paused
    std::string endReason;
    bool active() const { return endedAt == 0; }
};

/// One decision of a rollout: its start, each judged window (hold | healthy | unhealthy), each
/// step (advance), its end (promote | rollback | abort | ended) and the user's pause and resume.
/// `numbers` is JSON: the figures the verdict rests on. Consecutive holds at one step are kept as
/// one row whose `repeats` counts them (a canary that gets no traffic does not flood the history).
struct RolloutDecision {
    int64_t id = 0;
    int64_t rolloutId = 0;
    double t = 0;       // the latest time it was made
    double firstT = 0;  // the first (repeats > 1)
    std::string kind;
    int step = 0;
    int32_t weightBp = 0;
    std::string reason;
    std::string numbers = "{}";
    int repeats = 1;
    std::string actor = "auto";
};

class Registry {
public:
    /// Opens (and if needed migrates) the workspace at `workspacePath`; throws StoreError as Store does.
    explicit Registry(const std::string& workspacePath);
    ~Registry();
    Registry(const Registry&) = delete;
    Registry& operator=(const Registry&) = delete;

    const std::string& workspacePath() const;
    /// Where a model's artifacts live: <workspace file>-files/models/<name> (Store::filesDirFor).
    std::string modelDir(const std::string& name) const;

    // ---- versions --------------------------------------------------------------------
    /// Adds the next version of `v.name` (creating the model); v.version is ignored and the
    /// assigned number returned in the result. The artifact must already be at v.path. A parent
    /// (v.parentVersion of v.parentModel, or of v.name when that is empty) must exist.
    ModelVersion addVersion(ModelVersion v);
    /// The version number the next addVersion of `name` will get (for naming its file).
    int64_t nextVersion(const std::string& name) const;
    /// Replaces the compression report of NAME:V (JSON, CompressReport). Throws NotFoundError.
    void setReport(const std::string& name, int64_t version, const std::string& reportJson);
    std::vector<ModelSummary> listModels() const;
    std::vector<ModelVersion> versions(const std::string& name) const;  // oldest first
    /// NAME (latest), NAME:V or NAME@ALIAS. Throws NotFoundError.
    ModelVersion resolve(const ModelRef& ref) const;
    /// Points ALIAS at version V (replacing where it pointed). Throws NotFoundError.
    void setAlias(const std::string& name, const std::string& alias, int64_t version);
    void removeAlias(const std::string& name, const std::string& alias);

    // ---- deployments -----------------------------------------------------------------
    /// Records a new live deployment; the model's previous live one (if any) ends now with
    /// "replaced by vN". Returns the new id.
    int64_t recordDeployment(Deployment d);
    /// Ends a live deployment, and forgets its server's control token (the record's instance
    /// has no server any more).
    void endDeployment(int64_t id, const std::string& reason);
    /// A deployed server's control token, kept by its --instance-id nonce (shared by every record
    /// of one server, across hot swaps); empty when none is stored (deployments made before
    /// workspace schema 7, or with no instance). A secret: never print or log it.
    std::string deploymentToken(const std::string& instance) const;
    /// Stores (or replaces) the token of the server started with `instance`: before it starts,
    /// so that no server runs with a token the workspace lacks. `instance` must not be empty.
    void storeDeploymentToken(const std::string& instance, const std::string& token);
    void forgetDeploymentToken(const std::string& instance);
    std::vector<Deployment> deployments(const std::string& model) const;  // newest (highest id) first
    std::vector<Deployment> allDeployments() const;                       // newest (highest id) first
    std::optional<Deployment> liveDeployment(const std::string& model) const;

    // ---- rollouts ------------------------------------------------------------------------
    /// Records a new rollout (r.id, times and the end are ignored) and returns its id. Throws
    /// ConfigError when the model has a running or paused one already (checked in the same
    /// transaction, so two starts cannot both succeed).
    int64_t createRollout(const Rollout& r);
    /// Removes a rollout that never took effect (its start failed), with its decisions.
    void deleteRollout(int64_t id);
    /// Writes where `r` stands: state, step, weight, bad windows, end (0: still active).
    void updateRollout(const Rollout& r);
    std::optional<Rollout> activeRollout(const std::string& model) const;
    std::optional<Rollout> rollout(int64_t id) const;
    std::vector<Rollout> rollouts(const std::string& model) const;  // newest first
    /// Appends a decision; a hold right after a hold at the same step and weight updates that row
    /// instead (t, reason, numbers, repeats + 1).
    void addRolloutDecision(const RolloutDecision& d);
    std::vector<RolloutDecision> rolloutDecisions(int64_t rolloutId) const;  // oldest first

    // ---- serving metrics and alerts ----------------------------------------------------
    void appendServingMetrics(const std::string& model, int64_t version, double t,
                              const std::map<std::string, double>& values);
    std::vector<std::string> servingKeys(const std::string& model) const;
    /// Points of one key with t > since, oldest first.
    std::vector<ServingPoint> servingMetrics(const std::string& model, const std::string& key,
                                             double since = 0) const;
    int64_t fireAlert(const std::string& model, const std::string& rule, const std::string& message,
                      double value, double t);
    void resolveAlert(int64_t id, double t);
    /// Alerts of a model (all models when empty) fired or still firing after `since`, newest first.
    std::vector<AlertRecord> alerts(const std::string& model = {}, double since = 0) const;

private:
    struct Impl;
    std::unique_ptr<Impl> d;
};

}  // namespace lathe::core
