// Kafka's Java client end to end: creates TOPIC with PARTITIONS partitions, sends COUNT
// records with the idempotent producer (acks=all), then reads them all back with a
// consumer in GROUP and commits. Prints one "name value" line per result for the test.
// CLIENT_PROPERTIES, if given, is a properties file every client takes (security.protocol,
// ssl.truststore.location, ...).
// Usage: java -cp 'JARS/*' ProduceConsume.java BOOTSTRAP TOPIC PARTITIONS COUNT GROUP [CLIENT_PROPERTIES]

import java.io.FileInputStream;
import java.time.Duration;
import java.util.HashSet;
import java.util.List;
import java.util.Properties;
import java.util.Set;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class ProduceConsume {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], group = args[4];
        int partitions = Integer.parseInt(args[2]), count = Integer.parseInt(args[3]);
        Properties common = new Properties();
        if (args.length > 5) {
            try (FileInputStream in = new FileInputStream(args[5])) {
                common.load(in);
            }
        }
        common.put("bootstrap.servers", bootstrap);
        try (Admin admin = Admin.create(common)) {
            admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
        }

        Properties produce = new Properties();
        produce.putAll(common);
        produce.put("enable.idempotence", "true");
        produce.put("acks", "all");
        produce.put("key.serializer", StringSerializer.class.getName());
        produce.put("value.serializer", StringSerializer.class.getName());
        long acked = 0;
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(produce)) {
            var sends = new java.util.ArrayList<java.util.concurrent.Future<?>>();
            for (int i = 0; i < count; i++) {
                sends.add(producer.send(new ProducerRecord<>(topic, "k" + i, "v" + i)));
            }
            for (var send : sends) {
                send.get();
                acked++;
            }
        }
        System.out.println("acked " + acked);

        Properties consume = new Properties();
        consume.putAll(common);
        consume.put("group.id", group);
        consume.put("auto.offset.reset", "earliest");
        consume.put("enable.auto.commit", "false");
        consume.put("key.deserializer", StringDeserializer.class.getName());
        consume.put("value.deserializer", StringDeserializer.class.getName());
        Set<String> values = new HashSet<>();
        long received = 0;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(consume)) {
            consumer.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + 60_000;
            while (received < count && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(500))) {
                    received++;
                    values.add(record.key() + "=" + record.value());
                }
            }
            consumer.commitSync();
            Set<TopicPartition> assigned = consumer.assignment();
            long committed = 0;
            for (OffsetAndMetadata offset : consumer.committed(assigned).values()) {
                committed += offset == null ? 0 : offset.offset();
            }
            System.out.println("assigned " + assigned.size());
            System.out.println("committed " + committed);
        }
        System.out.println("received " + received);
        System.out.println("distinct " + values.size());
    }
}
