#include "lathe/widgets/host_dialog.h"

#include <QDialogButtonBox>
#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSpinBox>
#include <QToolButton>
#include <QVBoxLayout>

#include <exception>
#include <filesystem>

#include "lathe/core/error.h"
#include "lathe/widgets/host_probe.h"

namespace lathe::widgets {

HostDialog::HostDialog(bool editing, const core::HostRecord& initial, Commit commit, QWidget* parent)
    : QDialog(parent), m_editing(editing), m_commit(std::move(commit)) {
    setWindowTitle(editing ? tr("Edit host %1").arg(QString::fromStdString(initial.name)) : tr("Add host"));
    setObjectName(QStringLiteral("hostDialog"));

    m_name = new QLineEdit(this);
    m_name->setObjectName(QStringLiteral("hostName"));
    m_name->setPlaceholderText(tr("gpu-a"));
    m_name->setToolTip(tr("The host's name in Lathe: 1 to 64 letters, digits, '.', '_' or '-'"));
    m_name->setReadOnly(editing);
    m_address = new QLineEdit(this);
    m_address->setObjectName(QStringLiteral("hostAddress"));
    m_address->setPlaceholderText(tr("host name, address or ssh-config alias; [user@]host[:port]"));
    m_port = new QSpinBox(this);
    m_port->setObjectName(QStringLiteral("hostPort"));
    m_port->setRange(0, 65535);
    m_port->setSpecialValueText(tr("default (ssh config, else 22)"));
    m_user = new QLineEdit(this);
    m_user->setObjectName(QStringLiteral("hostUser"));
    m_user->setPlaceholderText(tr("default (ssh config, else yours)"));
    m_identity = new QLineEdit(this);
    m_identity->setObjectName(QStringLiteral("hostIdentity"));
    m_identity->setPlaceholderText(tr("default (ssh-agent, then ~/.ssh keys)"));
    m_identity->setToolTip(tr("A private key file: only its path is kept, never the key"));
    m_browse = new QToolButton(this);
    m_browse->setText(QStringLiteral("…"));
    m_browse->setToolTip(tr("Choose a private key file"));
    auto* identityRow = new QWidget(this);
    auto* identityLayout = new QHBoxLayout(identityRow);
    identityLayout->setContentsMargins(0, 0, 0, 0);
    identityLayout->addWidget(m_identity, 1);
    identityLayout->addWidget(m_browse);
    m_lathectl = new QLineEdit(this);
    m_lathectl->setObjectName(QStringLiteral("hostLathectl"));
    m_lathectl->setPlaceholderText(tr("default (lathectl on its PATH)"));
    m_slots = new QSpinBox(this);
    m_slots->setObjectName(QStringLiteral("hostSlots"));
    m_slots->setRange(1, 4096);
    m_slots->setToolTip(tr("How many ranks it takes at once (1..4096), usually its GPUs"));

    auto* form = new QFormLayout;
    form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    form->addRow(tr("&Name"), m_name);
    form->addRow(tr("&Address"), m_address);
    form->addRow(tr("&Port"), m_port);
    form->addRow(tr("&User"), m_user);
    form->addRow(tr("&Identity file"), identityRow);
    form->addRow(tr("&lathectl path"), m_lathectl);
    form->addRow(tr("&Slots"), m_slots);

    m_error = new QLabel(this);
    m_error->setObjectName(QStringLiteral("hostDialogError"));
    m_error->setWordWrap(true);
    m_error->setStyleSheet(QStringLiteral("color: #c62828;"));
    m_error->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_error->hide();

    m_buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, this);
    m_buttons->button(QDialogButtonBox::Ok)->setText(editing ? tr("Save") : tr("Add"));

    auto* layout = new QVBoxLayout(this);
    layout->addLayout(form);
    layout->addWidget(m_error);
    layout->addWidget(m_buttons);

    connect(m_buttons, &QDialogButtonBox::accepted, this, &HostDialog::accept);
    connect(m_buttons, &QDialogButtonBox::rejected, this, &HostDialog::reject);
    connect(m_browse, &QToolButton::clicked, this, &HostDialog::browseIdentity);

    setRecord(initial);
    resize(520, sizeHint().height());
}

void HostDialog::setRecord(const core::HostRecord& host) {
    m_name->setText(QString::fromStdString(host.name));
    m_address->setText(QString::fromStdString(host.address));
    m_port->setValue(host.port);
    m_user->setText(QString::fromStdString(host.user));
    m_identity->setText(QString::fromStdString(host.identity));
    m_lathectl->setText(QString::fromStdString(host.lathectl));
    m_slots->setValue(host.slots);
    m_addedAt = host.addedAt;
}

core::HostRecord HostDialog::record() const {
    core::HostRecord h;
    h.name = m_name->text().trimmed().toStdString();
    h.addedAt = m_addedAt;
    const std::string address = m_address->text().trimmed().toStdString();
    h.address = address;
    h.port = m_port->value();
    h.user = m_user->text().trimmed().toStdString();
    // A user or port written in the address goes to its own field; the store's address is the host.
    if (!address.empty() && address.front() != '-' && address.find_first_of(" \t") == std::string::npos) {
        const AddressParts a = splitAddress(address);
        h.address = a.host;
        if (!a.user.empty()) {
            if (!h.user.empty() && h.user != a.user)
                throw core::ConfigError("the user field (" + h.user + ") and the user in the address (" +
                                        a.user + ") differ; give the user once");
            h.user = a.user;
        }
        if (a.port != 0) {
            if (h.port != 0 && h.port != a.port)
                throw core::ConfigError("the port field (" + std::to_string(h.port) +
                                        ") and the port in the address (" + std::to_string(a.port) +
                                        ") differ; give the port once");
            h.port = a.port;
        }
    }
    // A relative key path would mean another file from another directory.
    h.identity = m_identity->text().trimmed().toStdString();
    if (!h.identity.empty() && h.identity.front() != '~' && std::filesystem::path(h.identity).is_relative()) {
        std::error_code ec;
        const auto abs = std::filesystem::absolute(h.identity, ec);
        if (!ec) h.identity = abs.lexically_normal().string();
    }
    h.lathectl = m_lathectl->text().trimmed().toStdString();
    h.slots = m_slots->value();
    return h;
}

QString HostDialog::errorText() const { return m_error->isHidden() ? QString() : m_error->text(); }

void HostDialog::showError(const QString& text) {
    m_error->setText(text);
    m_error->setVisible(!text.isEmpty());
}

void HostDialog::accept() {
    QString error;
    try {
        const core::HostRecord h = record();
        // The name first, in the store's words, before anything else can complain.
        core::Store::validateHostName(h.name);
        error = m_commit ? m_commit(h) : QString();
    } catch (const std::exception& e) {
        error = QString::fromUtf8(e.what());
    }
    if (!error.isEmpty()) {
        showError(error);
        return;
    }
    showError({});
    QDialog::accept();
}

void HostDialog::browseIdentity() {
    QString start = m_identity->text().trimmed();
    if (start.isEmpty()) start = QDir::homePath() + QStringLiteral("/.ssh");
    const QString file = QFileDialog::getOpenFileName(this, tr("Private key file"), start,
                                                      tr("All files (*);;Key files (id_*)"), nullptr,
                                                      QFileDialog::DontResolveSymlinks);
    if (!file.isEmpty()) m_identity->setText(file);
}

}  // namespace lathe::widgets
