#include <catch2/catch.hpp>

#include <QFileInfo>
#include <QImage>
#include <QProcess>
#include <QProcessEnvironment>
#include <QStandardPaths>
#include <QTemporaryDir>
#include <QThread>

#include "skip.h"
#include "test_helpers.h"

using lathe::test::outputPath;
using lathe::test::waitUntil;

namespace {

// A display number nobody uses: no lock file and no socket.
int freeDisplay() {
    for (int n = 91; n < 160; ++n) {
        if (!QFileInfo::exists(QStringLiteral("/tmp/.X%1-lock").arg(n)) &&
            !QFileInfo::exists(QStringLiteral("/tmp/.X11-unix/X%1").arg(n)))
            return n;
    }
    return -1;
}

}  // namespace

TEST_CASE("Smoke: the lathe program starts and draws on a real X server", "[widgets][smoke]") {
    const QString xvfbPath = QStandardPaths::findExecutable(QStringLiteral("Xvfb"));
    if (xvfbPath.isEmpty())
        LATHE_SKIP("Xvfb is not installed (apt-get install xvfb), so no real-window smoke test");
    const QString lathe = QStringLiteral(LATHE_BIN_DIR "/lathe");
    REQUIRE(QFileInfo::exists(lathe));
    const int display = freeDisplay();
    REQUIRE(display > 0);
    const QString displayName = QStringLiteral(":%1").arg(display);

    QProcess xvfb;
    xvfb.setProcessChannelMode(QProcess::ForwardedErrorChannel);
    xvfb.start(xvfbPath, {displayName, QStringLiteral("-screen"), QStringLiteral("0"),
                          QStringLiteral("1400x900x24"), QStringLiteral("-nolisten"), QStringLiteral("tcp")});
    REQUIRE(xvfb.waitForStarted(5000));
    const QString socket = QStringLiteral("/tmp/.X11-unix/X%1").arg(display);
    REQUIRE(waitUntil([&] { return QFileInfo::exists(socket) || xvfb.state() != QProcess::Running; }, 10000));
    REQUIRE(xvfb.state() == QProcess::Running);

    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    const QString shot = outputPath("gui_smoke_xvfb.png");
    QFile::remove(shot);
    QProcess app;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert(QStringLiteral("DISPLAY"), displayName);
    env.insert(QStringLiteral("QT_QPA_PLATFORM"), QStringLiteral("xcb"));
    app.setProcessEnvironment(env);
    app.setProcessChannelMode(QProcess::MergedChannels);
    app.start(lathe, {QStringLiteral("--db"), dir.path() + "/smoke.db", QStringLiteral("--screenshot"), shot,
                      QStringLiteral("--quit-after"), QStringLiteral("3000")});
    REQUIRE(app.waitForStarted(5000));

    // The whole screen as the X server sees it, when ImageMagick's import is there.
    const QString importTool = QStandardPaths::findExecutable(QStringLiteral("import"));
    if (!importTool.isEmpty()) {
        QTest::qWait(2000);
        QProcess grab;
        grab.setProcessEnvironment(env);
        grab.start(importTool, {QStringLiteral("-window"), QStringLiteral("root"),
                                outputPath("gui_smoke_xvfb_root.png")});
        grab.waitForFinished(10000);
    } else {
        WARN("ImageMagick import not found: only the program's own window grab is saved");
    }

    const bool ended = app.waitForFinished(30000);
    const QString output = QString::fromLocal8Bit(app.readAll());
    INFO("lathe output: " << output.toStdString());
    if (!ended) app.kill();
    xvfb.terminate();
    if (!xvfb.waitForFinished(5000)) xvfb.kill();

    REQUIRE(ended);
    CHECK(app.exitStatus() == QProcess::NormalExit);
    CHECK(app.exitCode() == 0);
    REQUIRE(QFileInfo::exists(shot));
    const QImage image(shot);
    CHECK(image.width() >= 800);
    CHECK(image.height() >= 600);
}

TEST_CASE("The lathe program refuses a foreign file with a clear message and exit code 2",
          "[widgets][smoke]") {
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    const QString foreign = dir.path() + "/notes.db";
    {
        QFile f(foreign);
        REQUIRE(f.open(QIODevice::WriteOnly));
        f.write("this is not a sqlite database, just some notes\n");
    }
    QProcess app;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert(QStringLiteral("QT_QPA_PLATFORM"), QStringLiteral("offscreen"));
    app.setProcessEnvironment(env);
    app.start(QStringLiteral(LATHE_BIN_DIR "/lathe"), {QStringLiteral("--db"), foreign});
    REQUIRE(app.waitForFinished(30000));
    const QString err = QString::fromLocal8Bit(app.readAllStandardError());
    INFO("stderr: " << err.toStdString());
    CHECK(app.exitCode() == 2);
    CHECK(err.contains(foreign));
    CHECK(err.contains(QStringLiteral("Cannot open workspace")));
    // The file is untouched.
    QFile f(foreign);
    REQUIRE(f.open(QIODevice::ReadOnly));
    CHECK(f.readAll().startsWith("this is not a sqlite database"));
}
