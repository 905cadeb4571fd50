// lathe: the Qt workbench. `lathe [--db PATH] [MODEL]` opens (or creates) a workspace and shows
// its runs (and MODEL's graph on the Graph page); the same --db / $LATHE_DB / XDG default as lathectl, so
// both see the same runs.
#include <QApplication>
#include <QCommandLineParser>
#include <QDir>
#include <QFileInfo>
#include <QGuiApplication>
#include <QMessageBox>
#include <QTabWidget>
#include <QTimer>

#include <csignal>
#include <cstdio>
#include <exception>
#include <memory>

#include "lathe/core/error.h"
#include "lathe/core/store.h"
#include "lathe/widgets/graph_view.h"
#include "main_window.h"

int main(int argc, char** argv) {
    // Writes to a broken SSH proxy (ProxyJump) must fail the call, not end the workbench.
    std::signal(SIGPIPE, SIG_IGN);
    QApplication app(argc, argv);
    QApplication::setApplicationName(QStringLiteral("lathe"));
    QApplication::setApplicationDisplayName(QStringLiteral("Lathe"));
    QApplication::setApplicationVersion(QStringLiteral("0.1.0"));

    QCommandLineParser parser;
    parser.setApplicationDescription(QStringLiteral("Lathe workbench: configure, train and compare runs."));
    parser.addHelpOption();
    parser.addVersionOption();
    QCommandLineOption dbOption(
        QStringLiteral("db"),
        QStringLiteral("Workspace database (default: $LATHE_DB, else $XDG_DATA_HOME/lathe/lathe.db)."),
        QStringLiteral("PATH"));
    // For smoke tests on a real display server: save a grab of the window, then quit.
    QCommandLineOption screenshotOption(QStringLiteral("screenshot"),
                                        QStringLiteral("Save a PNG of the window after it is shown."),
                                        QStringLiteral("FILE"));
    QCommandLineOption quitAfterOption(QStringLiteral("quit-after"),
                                       QStringLiteral("Quit after MS milliseconds."), QStringLiteral("MS"));
    QCommandLineOption selectOption(QStringLiteral("select"),
                                    QStringLiteral("Runs to show on start, overlaid (default: the newest)."),
                                    QStringLiteral("ID,ID,..."));
    parser.addOption(dbOption);
    parser.addOption(selectOption);
    QCommandLineOption pageOption(
        QStringLiteral("page"),
        QStringLiteral(
            "Page to show on start: its tab's title (Runs, Models, Hosts, Data sets, Studies, Graph)."),
        QStringLiteral("NAME"));
    parser.addOption(pageOption);
    QCommandLineOption viewOption(
        QStringLiteral("view"),
        QStringLiteral(
            "Run view to show on start: its tab's title (Curves, Loss scale, Profile, Communication, "
            "Data, Log, Graph)."),
        QStringLiteral("NAME"));
    parser.addOption(viewOption);
    parser.addOption(screenshotOption);
    parser.addOption(quitAfterOption);
    parser.addPositionalArgument(
        QStringLiteral("model"),
        QStringLiteral("A TorchScript (.pt) or ONNX (.onnx) file to open on the Graph page."),
        QStringLiteral("[MODEL]"));
    parser.process(app);
    if (parser.positionalArguments().size() > 1) {
        std::fprintf(stderr, "lathe: give at most one model file\n");
        return 2;
    }

    std::string path;
    std::unique_ptr<lathe::core::Store> store;
    try {
        path = lathe::core::Store::resolvePath(parser.value(dbOption).toStdString());
        // A first start with the XDG default has no directory yet.
        QDir().mkpath(QFileInfo(QString::fromStdString(path)).absolutePath());
        store = std::make_unique<lathe::core::Store>(path);
    } catch (const std::exception& e) {
        const QString message = QStringLiteral("Cannot open workspace %1:\n%2")
                                    .arg(QString::fromStdString(path), QString::fromUtf8(e.what()));
        std::fprintf(stderr, "lathe: %s\n", message.toLocal8Bit().constData());
        // No one could dismiss a dialog on the headless platforms.
        const QString platform = QGuiApplication::platformName();
        if (platform != QLatin1String("offscreen") && platform != QLatin1String("minimal"))
            QMessageBox::critical(nullptr, QStringLiteral("Lathe"), message);
        return 2;
    }

    lathe::app::MainWindow window(std::move(store));
    window.show();
    if (parser.isSet(selectOption)) {
        std::vector<int64_t> ids;
        for (const QString& part : parser.value(selectOption).split(QLatin1Char(','), Qt::SkipEmptyParts)) {
            bool ok = false;
            const qlonglong id = part.trimmed().toLongLong(&ok);
            if (!ok || id <= 0) {
                std::fprintf(stderr, "lathe: --select: '%s' is not a run id\n", qPrintable(part));
                return 2;
            }
            ids.push_back(id);
        }
        // The runs list is read on a worker thread: select once it is in, instead of the newest.
        window.selectRunsWhenRefreshed(ids);
    }

    // --page and --view: a tab by its title, '&' shortcuts ignored.
    const auto selectTab = [](QTabWidget* tabs, const QString& want, const char* what) {
        for (int i = 0; i < tabs->count(); ++i)
            if (tabs->tabText(i).remove(QLatin1Char('&')).compare(want, Qt::CaseInsensitive) == 0) {
                tabs->setCurrentIndex(i);
                return;
            }
        std::fprintf(stderr, "lathe: no %s named %s\n", what, qPrintable(want));
    };
    if (parser.isSet(pageOption)) selectTab(window.pageTabs(), parser.value(pageOption), "page");
    if (parser.isSet(viewOption)) selectTab(window.viewTabs(), parser.value(viewOption), "run view");

    // A model given: its graph, on the Graph page (read and laid out on a worker thread).
    auto graphPending = std::make_shared<bool>(!parser.positionalArguments().isEmpty());
    if (*graphPending) {
        const QString model = parser.positionalArguments().front();
        if (!QFileInfo::exists(model)) {
            std::fprintf(stderr, "lathe: no model file at %s\n", qPrintable(model));
            return 2;
        }
        window.openModelFile(model);
    }

    if (parser.isSet(screenshotOption)) {
        const QString file = parser.value(screenshotOption);
        // Once the runs list (read on a worker thread) has landed and a model given has been laid
        // out, and the charts have painted.
        auto taken = std::make_shared<bool>(false);
        auto runsIn = std::make_shared<bool>(false);
        auto shoot = [&window, file, taken, runsIn, graphPending] {
            if (*taken || !*runsIn || *graphPending) return;
            *taken = true;
            QTimer::singleShot(500, &window, [&window, file] {
                if (!window.grab().save(file))
                    std::fprintf(stderr, "lathe: could not save %s\n", qPrintable(file));
            });
        };
        QObject::connect(&window, &lathe::app::MainWindow::runsRefreshed, &window, [&window, runsIn, shoot] {
            if (window.isRefreshingRuns()) return;
            *runsIn = true;
            shoot();
        });
        auto graphDone = [graphPending, shoot] {
            *graphPending = false;
            shoot();
        };
        QObject::connect(window.graphPage(), &lathe::widgets::GraphView::layoutReady, &window, graphDone);
        QObject::connect(window.graphPage(), &lathe::widgets::GraphView::loadFailed, &window, graphDone);
    }
    if (parser.isSet(quitAfterOption)) {
        bool ok = false;
        const int ms = parser.value(quitAfterOption).toInt(&ok);
        if (ok && ms >= 0) QTimer::singleShot(ms, &window, &QWidget::close);
    }
    return app.exec();
}
