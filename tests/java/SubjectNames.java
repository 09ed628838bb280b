import java.io.FileInputStream;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;

/** Prints the subject of each PEM certificate named, as X500Principal.getName() (RFC 2253). */
public class SubjectNames {
    public static void main(String[] args) throws Exception {
        CertificateFactory factory = CertificateFactory.getInstance("X.509");
        for (String path : args) {
            try (FileInputStream in = new FileInputStream(path)) {
                X509Certificate cert = (X509Certificate) factory.generateCertificate(in);
                System.out.println(cert.getSubjectX500Principal().getName());
            }
        }
    }
}
