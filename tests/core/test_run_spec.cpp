#include <catch2/catch.hpp>
#include <filesystem>

#include "lathe/core/error.h"
#include "lathe/core/run_spec.h"

using namespace lathe::core;

TEST_CASE("the default spec is valid and round-trips through TOML", "[spec]") {
    RunSpec spec;
    CHECK(validate(spec).empty());
    spec.lr = 0.0003;
    spec.hidden = {256, 64, 32};
    spec.data = "csv:/tmp/with \"quotes\".csv";
    spec.name = "it's a run";
    spec.schedule = "cosine";
    spec.minLr = 1e-6;
    const RunSpec back = parseRunSpec(toToml(spec), "roundtrip");
    CHECK(specParams(back) == specParams(spec));
    CHECK(back.lr == spec.lr);
    CHECK(back.minLr == spec.minLr);
}

TEST_CASE("flag values are validated with the key and its range", "[spec]") {
    RunSpec spec;
    CHECK_THROWS_WITH(setSpecValue(spec, "lr", "-1"), Catch::Contains("`lr`") && Catch::Contains("> 0"));
    CHECK_THROWS_WITH(setSpecValue(spec, "lr", "fast"), Catch::Contains("`lr`"));
    CHECK_THROWS_WITH(setSpecValue(spec, "epochs", "0"),
                      Catch::Contains("`epochs`") && Catch::Contains("1 to 100000"));
    CHECK_THROWS_WITH(setSpecValue(spec, "batch", "12abc"), Catch::Contains("`batch`"));
    CHECK_THROWS_WITH(setSpecValue(spec, "optimizer", "lbfgs"), Catch::Contains("sgd, adam, adamw"));
    CHECK_THROWS_WITH(setSpecValue(spec, "data", "mnist"), Catch::Contains("csv:PATH"));
    CHECK_THROWS_WITH(setSpecValue(spec, "hidden", "128,,4"), Catch::Contains("`hidden`"));
    CHECK_THROWS_WITH(setSpecValue(spec, "colour", "red"), Catch::Contains("unknown key `colour`"));
    CHECK(checkSpecValue("lr", "0.1").empty());
    CHECK_FALSE(checkSpecValue("lr", "0").empty());
    setSpecValue(spec, "hidden", "32, 16");
    CHECK(spec.hidden == std::vector<int64_t>{32, 16});
    CHECK(specValue(spec, "hidden") == "32,16");
}

TEST_CASE("cross-field rules are checked", "[spec]") {
    RunSpec spec;
    spec.minLr = 0.5;
    spec.lr = 0.1;
    const auto problems = validate(spec);
    REQUIRE(problems.size() == 1);
    CHECK_THAT(problems[0], Catch::Contains("`min_lr`"));
    spec.epochs = -3;  // written straight into the struct
    CHECK(validate(spec).size() == 2);
    CHECK_THROWS_AS(validateOrThrow(spec), ConfigError);
}

TEST_CASE("TOML errors name the file, the line and the key", "[spec]") {
    CHECK_THROWS_WITH(parseRunSpec("epochs = 5\nlr = 0\n", "run.toml"),
                      Catch::Contains("run.toml line 2") && Catch::Contains("`lr`"));
    CHECK_THROWS_WITH(parseRunSpec("epochs = 5\n\nmodle = \"mlp\"\n", "run.toml"),
                      Catch::Contains("line 3") && Catch::Contains("unknown key `modle`"));
    CHECK_THROWS_WITH(parseRunSpec("epochs = \"ten\"\n", "run.toml"), Catch::Contains("must be an integer"));
    CHECK_THROWS_WITH(parseRunSpec("epochs = = 3\n", "run.toml"), Catch::Contains("run.toml line 1"));
    CHECK_THROWS_WITH(parseRunSpec("hidden = [1, \"a\"]\n", "r"), Catch::Contains("array of integers"));
    CHECK_THROWS_WITH(loadRunSpec("/nonexistent/run.toml"), Catch::Contains("cannot read config"));
    const RunSpec ok = parseRunSpec("lr = 1\nhidden = [8]\nmodel = \"cnn\"\n", "r");
    CHECK(ok.lr == 1.0);  // an integer is accepted where a float is expected
    CHECK(ok.model == "cnn");
}

TEST_CASE("every shipped config in resources/configs is valid", "[spec]") {
    int n = 0;
    for (const auto& entry :
         std::filesystem::directory_iterator(std::string(LATHE_SOURCE_DIR) + "/resources/configs")) {
        if (entry.path().extension() != ".toml") continue;
        INFO(entry.path());
        CHECK_NOTHROW(loadRunSpec(entry.path().string()));
        ++n;
    }
    CHECK(n >= 3);
}
