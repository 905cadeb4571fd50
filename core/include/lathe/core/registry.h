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
