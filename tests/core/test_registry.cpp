#include <catch2/catch.hpp>
#include <thread>

#include "lathe/core/registry.h"
#include "lathe/core/store.h"
#include "temp_dir.h"

using namespace lathe::core;
using lathe::test::TempDir;

namespace {

ModelVersion version(const std::string& name, const std::string& path) {
    ModelVersion v;
    v.name = name;
    v.path = path;
    v.sha256 = std::string(64, 'a');
    v.sizeBytes = 1234;
    v.signature.inputs = {{"input", "FP32", {-1, 64}}};
    v.signature.outputs = {{"logits", "FP32", {-1, 10}}};
    v.signature.classNames = {"0", "1"};
    v.metrics = {{"val/accuracy", 0.97}};
    v.source = "file " + path;
    return v;
}

}  // namespace

TEST_CASE("model references parse NAME, NAME:V and NAME@ALIAS and refuse the rest", "[registry]") {
    CHECK(parseModelRef("digits").name == "digits");
    CHECK(parseModelRef("digits:3").version == 3);
    CHECK(parseModelRef("digits@production").alias == "production");
    CHECK(parseModelRef("digits:3").str() == "digits:3");
    for (const char* bad : {"", "digits:", "digits:x", "digits:0", "digits@", "a:1@b", "../etc", "-x", "a b",
                            "digits:99999999999999999999"})
        CHECK_THROWS_AS(parseModelRef(bad), ConfigError);
}

TEST_CASE("signatures round-trip through JSON, junk is refused", "[registry]") {
    ModelSignature s = version("m", "p").signature;
    const auto back = signatureFromJson(signatureToJson(s));
    REQUIRE(back.inputs.size() == 1);
    CHECK(back.inputs[0].shape == std::vector<int64_t>{-1, 64});
    CHECK(back.outputs[0].name == "logits");
    CHECK(back.classNames == s.classNames);
    CHECK_THROWS_AS(signatureFromJson("{\"inputs\": 3}"), ConfigError);
    CHECK_THROWS_AS(signatureFromJson("not json"), ConfigError);
}

TEST_CASE("versions auto-increment per model, aliases move, lookups fail clearly", "[registry]") {
    TempDir dir;
    Registry r(dir.file("ws.db"));
    CHECK(r.nextVersion("digits") == 1);
    CHECK(r.addVersion(version("digits", "/a/1.pt")).version == 1);
    auto v2 = version("digits", "/a/2.pt");
    v2.parentVersion = 1;
    CHECK(r.addVersion(v2).version == 2);
    CHECK(r.addVersion(version("other", "/b/1.pt")).version == 1);
    auto orphan = version("digits", "/a/x.pt");
    orphan.parentVersion = 9;
    CHECK_THROWS_AS(r.addVersion(orphan), NotFoundError);
    CHECK(r.nextVersion("digits") == 3);

    CHECK(r.resolve(parseModelRef("digits")).version == 2);
    CHECK(r.resolve(parseModelRef("digits:1")).path == "/a/1.pt");
    r.setAlias("digits", "production", 1);
    CHECK(r.resolve(parseModelRef("digits@production")).version == 1);
    r.setAlias("digits", "production", 2);
    const auto prod = r.resolve(parseModelRef("digits@production"));
    CHECK(prod.version == 2);
    CHECK(prod.parentVersion == 1);
    CHECK(prod.aliases == std::vector<std::string>{"production"});
    CHECK(prod.metrics.at("val/accuracy") == Approx(0.97));
    CHECK_THROWS_AS(r.setAlias("digits", "production", 7), NotFoundError);
    CHECK_THROWS_AS(r.resolve(parseModelRef("digits@staging")), NotFoundError);
    CHECK_THROWS_AS(r.resolve(parseModelRef("digits:5")), NotFoundError);
    CHECK_THROWS_AS(r.resolve(parseModelRef("nope")), NotFoundError);

    const auto models = r.listModels();
    REQUIRE(models.size() == 2);
    CHECK(models[0].name == "digits");
    CHECK(models[0].versions == 2);
    CHECK(models[0].aliases.at("production") == 2);
    r.removeAlias("digits", "production");
    CHECK_THROWS_AS(r.removeAlias("digits", "production"), NotFoundError);
}

TEST_CASE("two processes' worth of registries never hand out one version twice", "[registry]") {
    TempDir dir;
    const auto path = dir.file("ws.db");
    { Registry init(path); }
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&] {
            Registry r(path);  // its own connection, as another process would have
            for (int i = 0; i < 10; ++i) r.addVersion(version("m", "/x"));
        });
    for (auto& t : threads) t.join();
    Registry r(path);
    const auto vs = r.versions("m");
    REQUIRE(vs.size() == 40);
    for (size_t i = 0; i < vs.size(); ++i) CHECK(vs[i].version == static_cast<int64_t>(i) + 1);
}

TEST_CASE("deployment history: a new deployment replaces the live one", "[registry]") {
    TempDir dir;
    Registry r(dir.file("ws.db"));
    Deployment d;
    d.model = "digits";
    d.version = 1;
    d.url = "http://127.0.0.1:8500";
    d.pid = 42;
    const auto first = r.recordDeployment(d);
    d.version = 2;
    d.action = "deploy";
    const auto second = r.recordDeployment(d);
    const auto hist = r.deployments("digits");
    REQUIRE(hist.size() == 2);
    CHECK(hist[0].id == second);
    CHECK(hist[0].live());
    CHECK(hist[1].id == first);
    CHECK_FALSE(hist[1].live());
    CHECK(hist[1].endReason == "replaced by v2");
    REQUIRE(r.liveDeployment("digits"));
    CHECK(r.liveDeployment("digits")->version == 2);
    r.endDeployment(second, "undeployed");
    CHECK_FALSE(r.liveDeployment("digits"));
    CHECK(r.deployments("digits")[0].endReason == "undeployed");
}

TEST_CASE("a deployment's token is kept by its server's instance across hot swaps and forgotten when it ends",
          "[registry][deploy]") {
    TempDir dir;
    Registry r(dir.file("ws.db"));
    CHECK(r.deploymentToken("").empty());
    CHECK(r.deploymentToken("nonce-a").empty());  // none stored: a deployment from before tokens
    CHECK_THROWS_AS(r.storeDeploymentToken("", "t"), ConfigError);
    r.storeDeploymentToken("nonce-a", "token-a");
    r.storeDeploymentToken("nonce-b", "token-b");
    CHECK(r.deploymentToken("nonce-a") == "token-a");
    Deployment d;
    d.model = "digits";
    d.version = 1;
    d.url = "http://127.0.0.1:8500";
    d.instance = "nonce-a";
    r.recordDeployment(d);
    d.version = 2;  // a hot swap: the same server, a new record
    const auto swapped = r.recordDeployment(d);
    CHECK(r.deploymentToken("nonce-a") == "token-a");
    r.endDeployment(swapped, "undeployed");
    CHECK(r.deploymentToken("nonce-a").empty());
    CHECK(r.deploymentToken("nonce-b") == "token-b");  // another server's stays
    r.forgetDeploymentToken("nonce-b");
    CHECK(r.deploymentToken("nonce-b").empty());
}

TEST_CASE("serving metrics and alerts are stored per model", "[registry]") {
    TempDir dir;
    Registry r(dir.file("ws.db"));
    r.appendServingMetrics("digits", 1, 100.0, {{"p99_ms", 12.5}, {"qps", 300}});
    r.appendServingMetrics("digits", 2, 101.0, {{"p99_ms", 14.0}, {"qps", std::nan("")}});
    r.appendServingMetrics("other", 1, 101.0, {{"p99_ms", 99}});
    CHECK(r.servingKeys("digits") == std::vector<std::string>{"p99_ms", "qps"});
    const auto p99 = r.servingMetrics("digits", "p99_ms");
    REQUIRE(p99.size() == 2);
    CHECK(p99[1].value == 14.0);
    CHECK(p99[1].version == 2);
    CHECK(r.servingMetrics("digits", "p99_ms", 100.5).size() == 1);
    CHECK(r.servingMetrics("digits", "qps").size() == 1);  // NaN is not a point

    const auto id = r.fireAlert("digits", "p99_latency", "P99 120 ms above 100 ms for 3 samples", 120, 200);
    CHECK(r.alerts("digits").size() == 1);
    CHECK(r.alerts("digits")[0].resolvedAt == 0);
    r.resolveAlert(id, 210);
    CHECK(r.alerts("digits")[0].resolvedAt == 210);
    CHECK(r.alerts("other").empty());
    CHECK(r.alerts().size() == 1);
    CHECK(r.alerts("digits", 300).empty());  // resolved before 300
}

TEST_CASE("an older workspace is migrated to the registry schema", "[registry]") {
    TempDir dir;
    const auto path = dir.file("ws.db");
    int64_t run = 0;
    {
        Store s(path);
        run = s.createRun("e", "r", "mlp", "digits", "", {}, "h");
    }
    Registry r(path);
    auto v = version("m", "/p");
    v.runId = run;
    CHECK(r.resolve(parseModelRef(r.addVersion(v).name)).runId == run);
}
