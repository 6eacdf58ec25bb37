// Certificates for TLS tests, made with OpenSSL at test time: a CA and leaf certificates it
// signs (EC P-256, valid for a day), written as PEM files with private keys (mode 0600).
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace anview::testing {

class TestCa {
 public:
  explicit TestCa(const std::string& name) : key_(new_key()), cert_(X509_new()) {
    fill(cert_, key_, name, name, 1);
    if (X509_sign(cert_, key_, EVP_sha256()) == 0) throw std::runtime_error("X509_sign (CA)");
  }
  ~TestCa() {
    X509_free(cert_);
    EVP_PKEY_free(key_);
  }
  TestCa(const TestCa&) = delete;
  TestCa& operator=(const TestCa&) = delete;

  // Writes `dir`/ca.pem.
  std::string write_ca(const std::filesystem::path& dir) const {
    const std::string path = (dir / "ca.pem").string();
    write_cert(path, cert_);
    return path;
  }

  // A leaf certificate signed by this CA: `dir`/<name>.pem and `dir`/<name>.key.
  struct Leaf {
    std::string cert, key;
  };
  Leaf issue(const std::filesystem::path& dir, const std::string& name) const {
    EVP_PKEY* key = new_key();
    X509* cert = X509_new();
    fill(cert, key, name, issuer_name(), ++serial_);
    if (X509_sign(cert, key_, EVP_sha256()) == 0) throw std::runtime_error("X509_sign (leaf)");
    Leaf leaf{(dir / (name + ".pem")).string(), (dir / (name + ".key")).string()};
    write_cert(leaf.cert, cert);
    FILE* f = std::fopen(leaf.key.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("cannot write " + leaf.key);
    PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
    std::fclose(f);
    ::chmod(leaf.key.c_str(), 0600);
    X509_free(cert);
    EVP_PKEY_free(key);
    return leaf;
  }

 private:
  static EVP_PKEY* new_key() {
    EVP_PKEY* key = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
    if (key == nullptr) throw std::runtime_error("EVP_PKEY_Q_keygen");
    return key;
  }
  std::string issuer_name() const {
    char text[256];
    X509_NAME_get_text_by_NID(X509_get_subject_name(cert_), NID_commonName, text, sizeof text);
    return text;
  }
  static void fill(X509* cert, EVP_PKEY* key, const std::string& subject, const std::string& issuer,
                   long serial) {
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), serial);
    X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert), 86400);
    X509_set_pubkey(cert, key);
    X509_NAME_add_entry_by_txt(X509_get_subject_name(cert), "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(subject.c_str()), -1, -1, 0);
    X509_NAME_add_entry_by_txt(X509_get_issuer_name(cert), "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(issuer.c_str()), -1, -1, 0);
    if (subject == issuer) {  // the CA: basicConstraints CA:TRUE, so it may sign
      X509V3_CTX ctx;
      X509V3_set_ctx_nodb(&ctx);
      X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
      X509_EXTENSION* ext =
          X509V3_EXT_conf_nid(nullptr, &ctx, NID_basic_constraints, "critical,CA:TRUE");
      X509_add_ext(cert, ext, -1);
      X509_EXTENSION_free(ext);
    }
  }
  static void write_cert(const std::string& path, X509* cert) {
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("cannot write " + path);
    PEM_write_X509(f, cert);
    std::fclose(f);
  }

  EVP_PKEY* key_;
  X509* cert_;
  mutable long serial_ = 1;
};

// What the TLS tests need: the job's CA with two leaves, and a leaf of another CA (in
// `dir`/rogue).
struct TestPki {
  explicit TestPki(const std::filesystem::path& dir)
      : ca("anview job CA"),
        rogue("another CA"),
        ca_file(ca.write_ca(dir)),
        first(ca.issue(dir, "rank0")),
        second(ca.issue(dir, "rank1")),
        foreign((std::filesystem::create_directory(dir / "rogue"),
                 rogue.issue(dir / "rogue", "rank1"))) {}

  TestCa ca, rogue;
  std::string ca_file;
  TestCa::Leaf first, second, foreign;
};

}  // namespace anview::testing
