// Catch2 main for the GUI tests: widgets need a QApplication before the first test runs.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <QApplication>

#include "skip.h"

int main(int argc, char** argv) {
    // CTest sets offscreen; default to it too when the binary is run by hand or listed.
    if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
    QApplication app(argc, argv);
    return lathe::test::exitCode(Catch::Session().run(argc, argv));
}
