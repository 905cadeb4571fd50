// The window's Hosts page and the run form's Target, wired: hosts added on the page are offered
// to the form, and a run across hosts is checked before it exists — a host that refuses the
// connection fails the start with its name and the cause, and no run is created. No sshd: the
// refusing host is a closed loopback port.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <QDialogButtonBox>
#include <QFileInfo>
#include <QLineEdit>
#include <QPushButton>
#include <QSignalSpy>
#include <QSpinBox>
#include <QTabWidget>
#include <QTemporaryDir>

#include <memory>

#include "lathe/core/store.h"
#include "lathe/widgets/host_dialog.h"
#include "lathe/widgets/host_list_model.h"
#include "lathe/widgets/hosts_view.h"
#include "lathe/widgets/log_view.h"
#include "lathe/widgets/run_form.h"
#include "main_window.h"
#include "skip.h"
#include "test_helpers.h"
#include "training_session.h"

using lathe::app::MainWindow;
using lathe::app::TrainingSession;
using lathe::test::outputPath;
using lathe::test::waitUntil;

namespace {

int closedLoopbackPort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    socklen_t len = sizeof addr;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    ::close(fd);
    return ntohs(addr.sin_port);
}

}  // namespace

TEST_CASE("The window's Hosts page feeds the run form's Target, and a failing host starts no run",
          "[widgets][hosts][window]") {
    const QString lathectl = QStringLiteral(LATHE_BIN_DIR "/lathectl");
    if (!QFileInfo(lathectl).isExecutable())
        LATHE_SKIP(lathectl.toStdString() + " is not built (ninja lathectl)");
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    const int port = closedLoopbackPort();
    auto store = std::make_unique<lathe::core::Store>((dir.path() + "/workspace.db").toStdString());
    lathe::core::HostRecord a;
    a.name = "gpu-a";
    a.address = "127.0.0.1";
    a.port = port;
    a.slots = 2;
    store->addHost(a);
    auto window = std::make_unique<MainWindow>(std::move(store));
    window->resize(1400, 900);
    window->show();
    window->session()->setWorkerProgram(lathectl.toStdString());

    // Pages: Runs, Models, Hosts, Data sets, Studies, Graph; per-run tabs include the Log.
    QTabWidget* pages = window->pageTabs();
    REQUIRE(pages->count() == 6);
    CHECK(pages->tabText(2) == "Hosts");
    CHECK(pages->widget(2) == window->hostsView());
    CHECK(window->runView<lathe::widgets::LogView>() != nullptr);

    auto* form = window->runForm();
    CHECK(form->targetHostNames() == QStringList({"gpu-a"}));

    // A host added on the page is offered at once.
    pages->setCurrentIndex(2);
    auto* hosts = window->hostsView();
    REQUIRE(waitUntil([&] { return hosts->isVisible(); }, 2000));
    QTest::mouseClick(hosts->addButton(), Qt::LeftButton);
    REQUIRE(waitUntil([&] { return hosts->dialog() != nullptr; }, 2000));
    auto* dialog = hosts->dialog();
    dialog->nameEdit()->setText("gpu-b");
    dialog->addressEdit()->setText(QStringLiteral("127.0.0.1:%1").arg(port));
    dialog->slotsBox()->setValue(2);
    QTest::mouseClick(dialog->buttonBox()->button(QDialogButtonBox::Ok), Qt::LeftButton);
    REQUIRE(waitUntil([&] { return hosts->dialog() == nullptr; }, 2000));
    REQUIRE(window->store().host("gpu-b"));
    CHECK(form->targetHostNames() == QStringList({"gpu-a", "gpu-b"}));
    window->grab().save(outputPath("gui_hosts_page.png"));

    // A run across both: the check refuses it before a run exists.
    pages->setCurrentIndex(0);
    form->setFieldText("name", "across-hosts");
    form->setFieldText("epochs", "1");
    form->setTargetHosts(true);
    form->setHostSlots("gpu-a", 2);
    form->setHostSlots("gpu-b", 2);
    REQUIRE(form->isValid());
    REQUIRE(form->target().placement() == "gpu-a:2,gpu-b:2");
    QSignalSpy progress(window->session(), &TrainingSession::progress);
    QSignalSpy started(window->session(), &TrainingSession::started);
    QSignalSpy finished(window->session(), &TrainingSession::finished);
    QTest::mouseClick(form->startButton(), Qt::LeftButton);
    CHECK(form->isRunning());
    REQUIRE(waitUntil([&] { return finished.count() == 1; }, 60000));
    CHECK(started.count() == 0);
    CHECK(finished.front().at(0).toLongLong() == 0);  // no run was created
    CHECK(finished.front().at(1).toString() == "failed");
    const QString error = finished.front().at(2).toString();
    INFO(error.toStdString());
    CHECK(error.contains("not launched"));
    CHECK(error.contains("gpu-a"));
    CHECK(error.contains("gpu-b"));
    CHECK(progress.count() >= 1);
    CHECK(progress.front().at(0).toString().contains("Checking hosts gpu-a, gpu-b"));
    CHECK(window->store().listRuns().empty());
    CHECK_FALSE(form->isRunning());
    CHECK(window->lastError() == error);
}
