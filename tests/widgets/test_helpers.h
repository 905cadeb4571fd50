#pragma once
#include <QCoreApplication>
#include <QDir>
#include <QElapsedTimer>
#include <QString>
#include <QTest>

#include <functional>

namespace lathe::test {

/// Spins the event loop until `done` holds or `timeoutMs` passes; returns `done()`.
inline bool waitUntil(const std::function<bool()>& done, int timeoutMs) {
    QElapsedTimer t;
    t.start();
    while (!done()) {
        if (t.elapsed() > timeoutMs) return done();
        QTest::qWait(10);
    }
    return true;
}

inline QString outputPath(const QString& name) {
    QDir().mkpath(QStringLiteral(LATHE_TEST_OUTPUT_DIR));
    return QStringLiteral(LATHE_TEST_OUTPUT_DIR) + QLatin1Char('/') + name;
}

}  // namespace lathe::test
