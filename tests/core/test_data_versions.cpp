// Versioned data sets: manifests and root hashes, the content store, diff / checkout / rollback /
// verify round trips, the check of a changed source folder, and runs bound to an exact version.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lathe/core/data_versions.h"
#include "lathe/core/error.h"
#include "lathe/core/record.h"
#include "lathe/core/registry.h"
#include "lathe/core/sha256.h"
#include "lathe/core/store.h"
#include "temp_dir.h"

using namespace lathe::core;
using lathe::test::readFile;
using lathe::test::TempDir;
using lathe::test::writeFile;
namespace fs = std::filesystem;

namespace {

void put(const std::string& path, const std::string& content) {
    fs::create_directories(fs::path(path).parent_path());
    writeFile(path, content);
}

// A small image folder: two classes, a few files, one in a nested folder, one hidden file.
void makeImageFolder(const std::string& root) {
    put(root + "/cat/a.jpg", std::string("\xff\xd8\xff\xe0 cat a", 10));
    put(root + "/cat/b.png", "\x89PNG cat b");
    put(root + "/dog/c.jpg", std::string("\xff\xd8\xff\xe0 dog c", 10));
    put(root + "/dog/more/d.jpeg", "dog d");
    put(root + "/.DS_Store", "ignored");
}

// A CSV with two features and a label that depends on them (learnable).
std::string csvText(int rows, int seed) {
    std::ostringstream out;
    out << "a,b,label\n";
    for (int i = 0; i < rows; ++i) {
        const double a = ((i * 37 + seed) % 100) / 50.0 - 1.0, b = ((i * 61 + 3 * seed) % 100) / 50.0 - 1.0;
        out << a << "," << b << "," << (a + b > 0 ? "yes" : "no") << "\n";
    }
    return out.str();
}

void setMtime(const std::string& path, int64_t ns) {
    struct timespec t[2];
    t[0].tv_sec = t[1].tv_sec = static_cast<time_t>(ns / 1000000000);
    t[0].tv_nsec = t[1].tv_nsec = static_cast<long>(ns % 1000000000);
    REQUIRE(::utimensat(AT_FDCWD, path.c_str(), t, 0) == 0);
}

}  // namespace

TEST_CASE("data set references and kinds are checked", "[data-versions]") {
    CHECK(parseDataRef("cats").version == 0);
    CHECK(parseDataRef("cats:12").version == 12);
    CHECK_THROWS_WITH(parseDataRef("cats:0"), Catch::Contains("number >= 1"));
    CHECK_THROWS_WITH(parseDataRef("cats:x"), Catch::Contains("number >= 1"));
    CHECK_THROWS_WITH(parseDataRef("c a ts"), Catch::Contains("data set name"));
    TempDir dir;
    makeImageFolder(dir.file("img"));
    CHECK(detectDataKind(dir.file("img")) == "images");
    put(dir.file("idx/train-images-idx3-ubyte.gz"), "x");
    CHECK(detectDataKind(dir.file("idx")) == "idx");
    put(dir.file("t.csv"), "a,label\n1,x\n");
    CHECK(detectDataKind(dir.file("t.csv")) == "csv");
    put(dir.file("notes.txt"), "x");
    CHECK_THROWS_AS(detectDataKind(dir.file("notes.txt")), ConfigError);
    fs::create_directories(dir.file("empty"));
    CHECK_THROWS_WITH(detectDataKind(dir.file("empty")), Catch::Contains("one sub-folder per class"));
    CHECK_THROWS_WITH(detectDataKind(dir.file("nope")), Catch::Contains("no such file"));
    CHECK_THROWS_WITH(checkDataKind("csv", dir.file("img")), Catch::Contains("is a folder"));
    CHECK_THROWS_WITH(checkDataKind("parquet", dir.file("img")), Catch::Contains("images, csv or idx"));
}

TEST_CASE("a manifest hashes every file with SHA-256 and its root hash is independent of where and when",
          "[data-versions]") {
    TempDir dir;
    makeImageFolder(dir.file("a"));
    for (int threads : {1, 3}) {
        const auto files = scanDataFiles(dir.file("a"), threads);
        REQUIRE(files.size() == 4);  // the hidden file is not part of it
        CHECK(files[0].path == "cat/a.jpg");
        CHECK(files[3].path == "dog/more/d.jpeg");
        CHECK(files[3].sha256 == sha256Hex("dog d", 5));
        CHECK(files[3].size == 5);
    }
    // The same files elsewhere, written later: the same root hash (what a version is named by).
    makeImageFolder(dir.file("b/elsewhere"));
    const auto a = scanDataFiles(dir.file("a")), b = scanDataFiles(dir.file("b/elsewhere"));
    CHECK(manifestRootHash(a) == manifestRootHash(b));
    // The root hash is the documented text's hash.
    std::string text;
    for (const auto& f : a) text += f.sha256 + " " + std::to_string(f.size) + " " + f.path + "\n";
    CHECK(manifestRootHash(a) == sha256Hex(text.data(), text.size()));
    // A renamed file is another data set.
    fs::rename(dir.file("b/elsewhere/cat/a.jpg"), dir.file("b/elsewhere/cat/a2.jpg"));
    CHECK(manifestRootHash(scanDataFiles(dir.file("b/elsewhere"))) != manifestRootHash(a));
}

TEST_CASE("data add stores each content once, numbers versions and adds nothing for unchanged files",
          "[data-versions]") {
    TempDir dir;
    const auto src = dir.file("pets");
    makeImageFolder(src);
    DataSets sets(dir.file("ws/lathe.db"));
    auto r1 = sets.add("pets", src, {});
    CHECK(r1.created);
    CHECK(r1.version.version == 1);
    CHECK(r1.version.kind == "images");
    CHECK(r1.version.files == 4);
    CHECK(r1.version.current);
    CHECK(r1.version.source == fs::canonical(src).string());
    CHECK(r1.storedFiles == 4);
    CHECK(r1.version.rootHash == manifestRootHash(scanDataFiles(src)));
    // Stored read-only under objects/, named by hash.
    const auto object = sets.dataDir() + "/objects/" + sha256Hex("dog d", 5).substr(0, 2) + "/" +
                        sha256Hex("dog d", 5).substr(2);
    REQUIRE(fs::exists(object));
    CHECK(readFile(object) == "dog d");
    CHECK((fs::status(object).permissions() & fs::perms::owner_write) == fs::perms::none);

    auto again = sets.add("pets", src, {});
    CHECK_FALSE(again.created);
    CHECK(again.version.version == 1);

    // One changed, one added, one removed: v2, and only the new contents are stored.
    put(src + "/cat/b.png", "\x89PNG cat b, edited");
    put(src + "/dog/e.png", "dog e");
    fs::remove(src + "/cat/a.jpg");
    DataAddOptions o;
    o.message = "relabelled";
    auto r2 = sets.add("pets", src, o);
    CHECK(r2.created);
    CHECK(r2.version.version == 2);
    CHECK(r2.storedFiles == 2);
    CHECK(r2.version.message == "relabelled");
    const auto diff = sets.diff(r1.version, r2.version);
    CHECK(diff.added == std::vector<std::string>{"dog/e.png"});
    CHECK(diff.removed == std::vector<std::string>{"cat/a.jpg"});
    CHECK(diff.changed == std::vector<std::string>{"cat/b.png"});
    CHECK(sets.diff(r2.version, r2.version).empty());
    CHECK(sets.resolve({"pets", 0}).version == 2);
    CHECK(sets.resolve({"pets", 1}).rootHash == r1.version.rootHash);
    CHECK(sets.versions("pets").size() == 2);
    CHECK(sets.list().size() == 1);
    CHECK_THROWS_WITH(sets.resolve({"pets", 9}), Catch::Contains("no version 9"));
    CHECK_THROWS_WITH(sets.resolve({"cats", 0}), Catch::Contains("it has: pets"));
    CHECK_THROWS_AS(sets.add("bad name", src, {}), ConfigError);
    CHECK_THROWS_WITH(sets.add("pets", dir.file("missing"), {}), Catch::Contains("no such file"));
}

TEST_CASE("checkout writes a version back byte for byte, and rollback moves the current version",
          "[data-versions]") {
    TempDir dir;
    const auto src = dir.file("pets");
    makeImageFolder(src);
    DataSets sets(dir.file("ws/lathe.db"));
    const auto v1 = sets.add("pets", src, {}).version;
    put(src + "/dog/c.jpg", "replaced");
    const auto v2 = sets.add("pets", src, {}).version;
    put(src + "/dog/f.png", "new");
    const auto v3 = sets.add("pets", src, {}).version;
    REQUIRE(v3.version == 3);

    // v1 round-trips to identical bytes (its root hash again), even though the folder moved on.
    sets.checkout(v1, dir.file("out1"));
    CHECK(manifestRootHash(scanDataFiles(dir.file("out1"))) == v1.rootHash);
    CHECK(readFile(dir.file("out1/dog/c.jpg")) == std::string("\xff\xd8\xff\xe0 dog c", 10));
    // Into a folder with files in it: refused, nothing written.
    CHECK_THROWS_WITH(sets.checkout(v2, dir.file("out1")), Catch::Contains("not an empty folder"));

    // rollback: v2 current; again: back to v3 (it undoes the first); and a data set with one version
    // has nothing to go back to.
    CHECK(sets.rollback("pets").version == 2);
    CHECK(sets.resolve({"pets", 0}).version == 2);
    CHECK(sets.rollback("pets").version == 3);
    CHECK(sets.resolve({"pets", 0}).version == 3);
    put(dir.file("solo.csv"), csvText(10, 1));
    sets.add("solo", dir.file("solo.csv"), {});
    CHECK_THROWS_WITH(sets.rollback("solo"), Catch::Contains("no earlier current version"));
    CHECK_THROWS_AS(sets.rollback("nobody"), NotFoundError);
}

TEST_CASE("verify finds missing and corrupt stored files, and the source check sees edits",
          "[data-versions]") {
    TempDir dir;
    const auto src = dir.file("pets");
    makeImageFolder(src);
    DataSets sets(dir.file("ws/lathe.db"));
    const auto v = sets.add("pets", src, {}).version;
    CHECK(sets.verify(v).ok());
    CHECK(sets.checkSource(v, false).clean());
    CHECK(sets.checkSource(v, true).clean());

    // An edit that keeps the size and the mtime: only the full check sees it.
    const auto file = src + "/cat/b.png";
    struct stat st {};
    REQUIRE(::stat(file.c_str(), &st) == 0);
    const int64_t ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
    put(file, "\x89PNG cat B");
    setMtime(file, ns);
    CHECK(sets.checkSource(v, false).clean());
    CHECK(sets.checkSource(v, true).diff.changed == std::vector<std::string>{"cat/b.png"});
    put(src + "/dog/new.jpg", "x");
    CHECK(sets.checkSource(v, false).diff.added == std::vector<std::string>{"dog/new.jpg"});

    const auto objectOf = [&](const std::string& content) {
        const auto h = sha256Hex(content.data(), content.size());
        return sets.dataDir() + "/objects/" + h.substr(0, 2) + "/" + h.substr(2);
    };
    fs::remove(objectOf("dog d"));
    const auto corrupt = objectOf("\x89PNG cat b");
    fs::permissions(corrupt, fs::perms::owner_write, fs::perm_options::add);
    writeFile(corrupt, "\x89PNG cat X");
    const auto r = sets.verify(v);
    CHECK_FALSE(r.ok());
    CHECK(r.files == 4);
    CHECK(r.missing == std::vector<std::string>{"dog/more/d.jpeg"});
    CHECK(r.corrupt == std::vector<std::string>{"cat/b.png"});
    // A checkout does not write a corrupt file silently.
    CHECK_THROWS_WITH(sets.checkout(v, dir.file("out")), Catch::Contains("data verify pets:1"));
}

TEST_CASE("a run on dataset:NAME records the exact version and reads the files that version holds",
          "[data-versions][trainer]") {
    TempDir dir;
    const auto db = dir.file("ws/lathe.db");
    const auto csv = dir.file("src/points.csv");
    put(csv, csvText(120, 1));
    {
        DataSets sets(db);
        REQUIRE(sets.add("points", csv, {}).version.version == 1);
    }
    RunSpec spec;
    spec.data = "dataset:points";
    spec.epochs = 1;
    spec.hidden = {8};

    SECTION("an unchanged folder is read in place; the run records dataset:points:1") {
        const auto b = bindDataSet(spec, db);
        CHECK(b.recorded.data == "dataset:points:1");
        CHECK(b.used.data == "csv:" + fs::canonical(csv).string());
        REQUIRE(b.version);
        CHECK_THAT(b.note, Catch::Contains("unchanged"));
        Store store(db);
        const auto rec = trainAndRecord(store, spec, {});
        REQUIRE(rec.result.status == RunStatus::Completed);
        CHECK(store.run(rec.runId)->data == "dataset:points:1");
        CHECK_THAT(store.run(rec.runId)->config, Catch::Contains("dataset:points:1"));
        DataSets sets(db);
        REQUIRE(sets.versionOfRun(rec.runId));
        CHECK(sets.versionOfRun(rec.runId)->version == 1);
        CHECK(sets.runsOn(*b.version).size() == 1);
    }
    SECTION("a changed folder is refused, naming the file; a pinned version is read from the store") {
        put(csv, csvText(120, 2));
        try {
            bindDataSet(spec, db);
            FAIL("a changed data set was accepted");
        } catch (const ConfigError& ex) {
            CHECK_THAT(ex.what(), Catch::Contains("changed points.csv") &&
                                      Catch::Contains("lathectl data add points") &&
                                      Catch::Contains("dataset:points:1"));
        }
        spec.data = "dataset:points:1";
        const auto b = bindDataSet(spec, db);
        CHECK(b.recorded.data == "dataset:points:1");
        const auto path = b.used.data.substr(4);
        CHECK(path.find("/data/checkouts/" + b.version->rootHash) != std::string::npos);
        CHECK(readFile(path) == csvText(120, 1));  // the version's bytes, not the folder's
        CHECK_THAT(b.note, Catch::Contains("changed since"));
        Store store(db);
        CHECK(trainAndRecord(store, spec, {}).result.status == RunStatus::Completed);
        // The folder gone: the stored copy too, for an unpinned reference.
        fs::remove(csv);
        spec.data = "dataset:points";
        CHECK_THAT(bindDataSet(spec, db).note, Catch::Contains("is gone"));
    }
    SECTION("--verify-data checks contents: an edit that kept size and mtime is refused") {
        struct stat st {};
        REQUIRE(::stat(csv.c_str(), &st) == 0);
        const int64_t ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
        auto text = csvText(120, 1);
        text[text.size() - 2] = text[text.size() - 2] == 's' ? 'x' : 's';  // same length
        put(csv, text);
        setMtime(csv, ns);
        CHECK_NOTHROW(bindDataSet(spec, db, false));
        CHECK_THROWS_WITH(bindDataSet(spec, db, true), Catch::Contains("changed points.csv"));
    }
    SECTION("unknown data sets and plain data") {
        spec.data = "dataset:nothing";
        CHECK_THROWS_WITH(bindDataSet(spec, db), Catch::Contains("no data set 'nothing'"));
        spec.data = "digits";
        CHECK(bindDataSet(spec, db).used.data == "digits");
        CHECK_FALSE(bindDataSet(spec, db).version);
    }
}
