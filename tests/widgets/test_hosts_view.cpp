// The Hosts page on a real workspace: the inventory as a table, Add/Edit through the dialog,
// Remove after the question, the store's refusals shown in the dialog, check results in the
// model, and a check of a closed loopback port off the GUI thread. No sshd: the SSH paths that
// need one are covered by tests/remote and the lathectl hosts tests.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <QAbstractItemModelTester>
#include <QDialogButtonBox>
#include <QLineEdit>
#include <QPushButton>
#include <QSignalSpy>
#include <QSpinBox>
#include <QTableView>
#include <QTemporaryDir>

#include <memory>

#include "lathe/core/store.h"
#include "lathe/widgets/host_dialog.h"
#include "lathe/widgets/host_list_model.h"
#include "lathe/widgets/host_probe.h"
#include "lathe/widgets/hosts_view.h"
#include "test_helpers.h"

using lathe::core::HostRecord;
using lathe::core::Store;
using lathe::test::outputPath;
using lathe::test::waitUntil;
using lathe::widgets::HostDialog;
using lathe::widgets::HostListModel;
using lathe::widgets::HostProbe;
using lathe::widgets::HostsView;

namespace {

struct HostsFixture {
    QTemporaryDir dir;
    std::unique_ptr<Store> store;
    HostsFixture() {
        REQUIRE(dir.isValid());
        store = std::make_unique<Store>((dir.path() + "/workspace.db").toStdString());
        HostRecord a;
        a.name = "gpu-a";
        a.address = "10.0.0.2";
        a.slots = 2;
        store->addHost(a);
        HostRecord b;
        b.name = "gpu-b";
        b.address = "gpu-b.example";
        b.port = 2222;
        b.user = "alice";
        b.lathectl = "/opt/lathe/bin/lathectl";
        b.slots = 4;
        store->addHost(b);
    }
};

QString cell(const HostListModel& m, int row, int column) { return m.index(row, column).data().toString(); }

// Opens the Add dialog through its button and returns it.
HostDialog* openAdd(HostsView& view) {
    QTest::mouseClick(view.addButton(), Qt::LeftButton);
    REQUIRE(waitUntil([&] { return view.dialog() != nullptr && view.dialog()->isVisible(); }, 2000));
    return view.dialog();
}

// A loopback port nothing listens on (bound, read, released).
int closedLoopbackPort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    socklen_t len = sizeof addr;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    ::close(fd);
    return ntohs(addr.sin_port);
}

void clickOk(HostDialog* dialog) {
    QTest::mouseClick(dialog->buttonBox()->button(QDialogButtonBox::Ok), Qt::LeftButton);
}

}  // namespace

TEST_CASE("HostsView lists the workspace's hosts and adds one through the dialog", "[widgets][hosts]") {
    HostsFixture fx;
    HostsView view;
    view.resize(1100, 420);
    view.show();
    QAbstractItemModelTester tester(view.listModel(), QAbstractItemModelTester::FailureReportingMode::Fatal);
    QSignalSpy changed(&view, &HostsView::hostsChanged);
    view.setStore(fx.store.get());
    CHECK(changed.count() >= 1);

    const HostListModel& model = *view.listModel();
    REQUIRE(model.rowCount() == 2);
    REQUIRE(model.columnCount() == HostListModel::ColumnCount);
    CHECK(cell(model, 0, HostListModel::ColName) == "gpu-a");
    CHECK(cell(model, 0, HostListModel::ColAddress) == "10.0.0.2");
    CHECK(cell(model, 0, HostListModel::ColPort) == "—");
    CHECK(cell(model, 0, HostListModel::ColSlots) == "2");
    CHECK(cell(model, 0, HostListModel::ColStatus) == "not checked");
    CHECK(cell(model, 1, HostListModel::ColName) == "gpu-b");
    CHECK(cell(model, 1, HostListModel::ColPort) == "2222");
    CHECK(cell(model, 1, HostListModel::ColUser) == "alice");
    CHECK(cell(model, 1, HostListModel::ColLathectl) == "/opt/lathe/bin/lathectl");
    CHECK(cell(model, 1, HostListModel::ColSlots) == "4");
    CHECK(model.headerData(HostListModel::ColHostKey, Qt::Horizontal).toString() == "Host key");
    // Nothing selected: Edit, Remove and Trust wait for a host.
    CHECK(view.addButton()->isEnabled());
    CHECK_FALSE(view.editButton()->isEnabled());
    CHECK_FALSE(view.removeButton()->isEnabled());
    CHECK_FALSE(view.trustButton()->isEnabled());
    CHECK(view.checkButton()->isEnabled());

    // Add: the user and port written in the address go to their own fields, as with
    // `lathectl hosts add --address alice@10.0.0.4:2200`.
    HostDialog* dialog = openAdd(view);
    CHECK_FALSE(dialog->isEditing());
    CHECK_FALSE(dialog->nameEdit()->isReadOnly());
    CHECK(dialog->slotsBox()->minimum() == 1);
    CHECK(dialog->slotsBox()->maximum() == 4096);
    CHECK(dialog->portBox()->maximum() == 65535);
    QTest::keyClicks(dialog->nameEdit(), "gpu-c");
    QTest::keyClicks(dialog->addressEdit(), "bob@10.0.0.4:2200");
    dialog->slotsBox()->setValue(3);
    dialog->lathectlEdit()->setText("~/bin/lathectl");
    dialog->identityEdit()->setText("/home/bob/.ssh/id_ed25519");
    dialog->grab().save(outputPath("host_dialog_add.png"));
    const int before = changed.count();
    clickOk(dialog);
    REQUIRE(waitUntil([&] { return view.dialog() == nullptr; }, 2000));

    const auto added = fx.store->host("gpu-c");
    REQUIRE(added);
    CHECK(added->address == "10.0.0.4");
    CHECK(added->user == "bob");
    CHECK(added->port == 2200);
    CHECK(added->slots == 3);
    CHECK(added->lathectl == "~/bin/lathectl");
    CHECK(added->identity == "/home/bob/.ssh/id_ed25519");
    REQUIRE(model.rowCount() == 3);
    CHECK(cell(model, 2, HostListModel::ColName) == "gpu-c");
    CHECK(changed.count() > before);
    CHECK(view.selectedHost() == "gpu-c");
    CHECK(view.statusText().contains("gpu-c"));
    CHECK(view.editButton()->isEnabled());
    CHECK(view.removeButton()->isEnabled());

    // Edit: the name is fixed, the rest is saved.
    view.selectHost("gpu-a");
    QTest::mouseClick(view.editButton(), Qt::LeftButton);
    REQUIRE(waitUntil([&] { return view.dialog() != nullptr; }, 2000));
    dialog = view.dialog();
    CHECK(dialog->isEditing());
    CHECK(dialog->nameEdit()->isReadOnly());
    CHECK(dialog->nameEdit()->text() == "gpu-a");
    CHECK(dialog->addressEdit()->text() == "10.0.0.2");
    CHECK(dialog->slotsBox()->value() == 2);
    dialog->slotsBox()->setValue(8);
    dialog->userEdit()->setText("carol");
    clickOk(dialog);
    REQUIRE(waitUntil([&] { return view.dialog() == nullptr; }, 2000));
    CHECK(fx.store->host("gpu-a")->slots == 8);
    CHECK(fx.store->host("gpu-a")->user == "carol");
    CHECK(cell(model, 0, HostListModel::ColSlots) == "8");
    view.grab().save(outputPath("hosts_view.png"));
}

TEST_CASE("HostsView shows the store's refusals in the dialog and adds nothing", "[widgets][hosts]") {
    HostsFixture fx;
    HostsView view;
    view.resize(1100, 420);
    view.show();
    view.setStore(fx.store.get());
    REQUIRE(view.listModel()->rowCount() == 2);

    HostDialog* dialog = openAdd(view);
    // A name that could read as something else.
    dialog->nameEdit()->setText("bad name");
    dialog->addressEdit()->setText("10.0.0.9");
    clickOk(dialog);
    CHECK(view.dialog() == dialog);
    CHECK(dialog->isVisible());
    CHECK(dialog->errorText().contains("host name 'bad name'"));
    dialog->grab().save(outputPath("host_dialog_error.png"));

    dialog->nameEdit()->setText("-x");
    clickOk(dialog);
    CHECK(dialog->errorText().contains("starts with '-'"));

    // Fixed name, no address: the store's message; what was typed stays.
    dialog->nameEdit()->setText("gpu-d");
    dialog->addressEdit()->clear();
    clickOk(dialog);
    CHECK(dialog->isVisible());
    CHECK(dialog->errorText().contains("address is empty"));
    CHECK(dialog->nameEdit()->text() == "gpu-d");

    // An address with a space; then a port given twice, differently.
    dialog->addressEdit()->setText("gpu d");
    clickOk(dialog);
    CHECK(dialog->errorText().contains("no spaces"));
    dialog->addressEdit()->setText("10.0.0.9:2201");
    dialog->portBox()->setValue(2202);
    clickOk(dialog);
    CHECK(dialog->errorText().contains("give the port once"));
    dialog->portBox()->setValue(0);

    // Slots outside 1..4096 cannot be typed: the spin box holds them in range.
    dialog->slotsBox()->setValue(0);
    CHECK(dialog->slotsBox()->value() == 1);
    dialog->slotsBox()->setValue(5000);
    CHECK(dialog->slotsBox()->value() == 4096);

    // A name already taken.
    dialog->nameEdit()->setText("gpu-a");
    clickOk(dialog);
    CHECK(dialog->errorText().contains("already exists"));
    CHECK(fx.store->host("gpu-a")->address == "10.0.0.2");  // untouched

    CHECK(fx.store->hosts().size() == 2);
    CHECK(view.listModel()->rowCount() == 2);

    // Cancel adds nothing either.
    dialog->nameEdit()->setText("gpu-e");
    QTest::mouseClick(dialog->buttonBox()->button(QDialogButtonBox::Cancel), Qt::LeftButton);
    REQUIRE(waitUntil([&] { return view.dialog() == nullptr; }, 2000));
    CHECK(fx.store->hosts().size() == 2);
    CHECK_FALSE(fx.store->host("gpu-e"));
}

TEST_CASE("HostsView removes a host only after the question", "[widgets][hosts]") {
    HostsFixture fx;
    HostsView view;
    view.show();
    view.setStore(fx.store.get());
    QStringList asked;
    bool answer = false;
    view.setConfirmHook([&](const QString&, const QString& question) {
        asked << question;
        return answer;
    });

    view.selectHost("gpu-b");
    REQUIRE(view.selectedHost() == "gpu-b");
    QTest::mouseClick(view.removeButton(), Qt::LeftButton);
    REQUIRE(asked.size() == 1);
    CHECK(asked.front().contains("gpu-b (alice@gpu-b.example:2222)"));
    CHECK(fx.store->host("gpu-b"));
    CHECK(view.listModel()->rowCount() == 2);

    answer = true;
    QSignalSpy changed(&view, &HostsView::hostsChanged);
    QTest::mouseClick(view.removeButton(), Qt::LeftButton);
    CHECK(asked.size() == 2);
    CHECK_FALSE(fx.store->host("gpu-b"));
    REQUIRE(view.listModel()->rowCount() == 1);
    CHECK(view.listModel()->index(0, 0).data().toString() == "gpu-a");
    CHECK(changed.count() >= 1);
    CHECK(view.statusText().contains("Removed host gpu-b"));
}

TEST_CASE("HostListModel shows check results and judges them", "[widgets][hosts]") {
    HostListModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::Fatal);
    HostRecord a;
    a.name = "gpu-a";
    a.address = "10.0.0.2";
    a.slots = 2;
    HostRecord b = a;
    b.name = "gpu-b";
    b.address = "10.0.0.3";
    b.slots = 8;
    model.setHosts({b, a});  // sorted by name
    REQUIRE(model.rowCount() == 2);
    CHECK(model.index(0, 0).data().toString() == "gpu-a");
    model.setExpectedVersion("lathectl 0.1.0");

    HostProbe ok;
    ok.reachable = true;
    ok.exitStatus = 0;
    ok.os = "Linux 6.1.0";
    ok.arch = "x86_64";
    ok.cores = 4;
    ok.memoryKb = 16 * 1024 * 1024;
    ok.gpus = {"NVIDIA H100 80GB HBM3, 81559 MiB", "NVIDIA H100 80GB HBM3, 81559 MiB"};
    ok.lathectlVersion = "lathectl 0.1.0";
    ok.lathectlMatches = true;
    ok.fingerprint = "SHA256:abc";
    ok.address = "10.0.0.2";
    model.setChecking("gpu-a");
    CHECK(model.state("gpu-a") == HostListModel::State::Checking);
    CHECK(model.statusText("gpu-a") == "checking…");
    model.setProbe("gpu-a", ok);
    CHECK(model.state("gpu-a") == HostListModel::State::Ok);
    CHECK(model.index(0, HostListModel::ColSystem).data().toString() == "Linux 6.1.0 x86_64");
    CHECK(model.index(0, HostListModel::ColCores).data().toInt() == 4);
    CHECK(model.index(0, HostListModel::ColMemory).data().toString() == "16.0 GiB");
    CHECK(model.index(0, HostListModel::ColGpus).data().toString() == "2 × NVIDIA H100 80GB HBM3, 81559 MiB");
    CHECK(model.index(0, HostListModel::ColVersion).data().toString() == "lathectl 0.1.0 ✓");
    CHECK(model.index(0, HostListModel::ColHostKey).data().toString() == "SHA256:abc");
    CHECK(model.statusText("gpu-a").startsWith("ok"));

    // Another version there, and more slots than cores: reachable, with the reasons.
    HostProbe other = ok;
    other.lathectlVersion = "lathectl 0.0.9";
    other.lathectlMatches = false;
    model.setProbe("gpu-b", other);
    CHECK(model.state("gpu-b") == HostListModel::State::Warning);
    CHECK(model.statusText("gpu-b").contains("lathectl is lathectl 0.0.9, this is lathectl 0.1.0"));
    CHECK(model.statusText("gpu-b").contains("8 slots but 4 cores"));
    CHECK(model.index(1, HostListModel::ColVersion).data().toString() == "lathectl 0.0.9 (differs)");

    // An unknown host key: Trust is offered.
    HostProbe unknown;
    unknown.problem = "host gpu-b: host key not in known_hosts (SHA256:xyz)";
    unknown.key = lathe::widgets::HostKeyState::Unknown;
    unknown.fingerprint = "SHA256:xyz";
    model.setProbe("gpu-b", unknown);
    CHECK(model.state("gpu-b") == HostListModel::State::UnknownKey);
    CHECK(model.statusText("gpu-b").contains("Trust"));
    CHECK(model.index(1, HostListModel::ColHostKey)
              .data(Qt::ToolTipRole)
              .toString()
              .contains("not in known_hosts"));

    // An edit of how a host is reached makes its result stale; a slots change does not.
    a.slots = 3;
    model.setHosts({a, b});
    CHECK(model.state("gpu-a") == HostListModel::State::Ok);
    a.address = "10.0.0.22";
    model.setHosts({a, b});
    CHECK(model.state("gpu-a") == HostListModel::State::Unchecked);
    // A removed host's result goes with it.
    model.setHosts({a});
    CHECK(model.rowCount() == 1);
    CHECK(model.rowOfHost("gpu-b") == -1);
}

TEST_CASE("HostsView checks a host off the GUI thread and shows why it failed", "[widgets][hosts]") {
    // A loopback port that refuses connections: no sshd, and an answer within milliseconds.
    const int closedPort = closedLoopbackPort();
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    Store store((dir.path() + "/workspace.db").toStdString());
    HostRecord h;
    h.name = "closed";
    h.address = "127.0.0.1";
    h.port = closedPort;
    store.addHost(h);

    HostsView view;
    view.show();
    view.setStore(&store);
    view.setConnectTimeout(5);
    view.setKnownHostsFile((dir.path() + "/known_hosts").toStdString());
    view.setLathectlProgram(LATHE_BIN_DIR "/lathectl");
    QSignalSpy checked(&view, &HostsView::checked);
    QTest::mouseClick(view.checkButton(), Qt::LeftButton);  // none selected: all of them
    CHECK(view.listModel()->state("closed") == HostListModel::State::Checking);
    CHECK(view.busyCount() == 1);
    REQUIRE(waitUntil([&] { return checked.count() == 1; }, 20000));
    CHECK(view.busyCount() == 0);
    CHECK(view.listModel()->state("closed") == HostListModel::State::Failed);
    const QString status = view.listModel()->statusText("closed");
    INFO(status.toStdString());
    CHECK(status.contains("closed"));
    CHECK(view.statusText().contains("closed"));
    // This build's version was found for the version column's verdicts.
    CHECK(view.listModel()->expectedVersion().startsWith("lathectl "));
}

TEST_CASE("hostSpecFor takes the address apart like lathectl", "[widgets][hosts]") {
    HostRecord h;
    h.name = "gpu";
    h.address = "alice@10.0.0.2:2222";
    auto spec = lathe::widgets::hostSpecFor(h);
    CHECK(spec.host == "10.0.0.2");
    CHECK(spec.user == "alice");
    CHECK(spec.port == 2222);
    h.address = "gpu-alias";
    h.port = 2200;
    h.user = "bob";
    h.identity = "/keys/id";
    spec = lathe::widgets::hostSpecFor(h);
    CHECK(spec.host == "gpu-alias");
    CHECK(spec.port == 2200);
    CHECK(spec.user == "bob");
    CHECK(spec.identityFile == "/keys/id");
    h.port = 0;
    spec = lathe::widgets::hostSpecFor(h);
    CHECK(spec.port == 0);  // the ssh config's, else 22
    h.address = "[::1]:2022";
    spec = lathe::widgets::hostSpecFor(h);
    CHECK(spec.host == "::1");
    CHECK(spec.port == 2022);
}
