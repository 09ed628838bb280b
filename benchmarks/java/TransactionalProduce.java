// Kafka's Java client producing as benchmarks/transactions.py does with confluent-kafka:
// idempotent, idempotent flushed every 1,000 records, transactions of 1,000 records and of
// 100 ms (transactions v2 where the broker finalizes transaction.version 2). Each round
// runs every mode on a topic of its own; the first round warms the JVM up.
// Prints "<round> <mode> <MiB/s>" per mode and round.
// Usage: java -cp 'JARS/*' TransactionalProduce.java BOOTSTRAP RECORDS SIZE ROUNDS

import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class TransactionalProduce {
    static final List<String> MODES = List.of("idempotent", "flush-1000", "every-1000", "every-100ms");

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        int records = Integer.parseInt(args[1]), rounds = Integer.parseInt(args[3]);
        byte[] value = new byte[Integer.parseInt(args[2])];
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
            for (int round = 0; round < rounds; round++) {
                for (String mode : MODES) {
                    String topic = "java-" + mode + "-" + round + "-" + System.nanoTime();
                    admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
                    double seconds = produce(bootstrap, topic, mode, value, records);
                    double mib = (double) records * value.length / (1 << 20);
                    System.out.printf("%d %s %.1f%n", round, mode, mib / seconds);
                }
            }
        }
    }

    /** Seconds from the first send to the last acknowledgement (or commit). */
    static double produce(String bootstrap, String topic, String mode, byte[] value, int records)
            throws Exception {
        boolean transactional = mode.startsWith("every-");
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("acks", "all");
        p.put("linger.ms", "5");
        p.put("batch.size", "1000000");
        p.put("compression.type", "none");
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        if (transactional) p.put("transactional.id", topic);
        else p.put("enable.idempotence", "true");
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            producer.partitionsFor(topic);
            if (transactional) producer.initTransactions();
            long started = System.nanoTime(), lastCommit = started;
            if (transactional) producer.beginTransaction();
            for (int i = 0; i < records; i++) {
                producer.send(new ProducerRecord<>(topic, value));
                boolean thousand = (i + 1) % 1000 == 0;
                if (mode.equals("flush-1000") && thousand) producer.flush();
                boolean due = mode.equals("every-1000")
                        ? thousand
                        : mode.equals("every-100ms") && System.nanoTime() - lastCommit >= 100_000_000L;
                if (due) {
                    producer.commitTransaction();
                    producer.beginTransaction();
                    lastCommit = System.nanoTime();
                }
            }
            if (transactional) producer.commitTransaction();
            else producer.flush();
            return (System.nanoTime() - started) / 1e9;
        }
    }
}
