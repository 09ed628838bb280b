// Kafka's Java client in several security settings, one JVM for all (a JVM start costs
// seconds). Each CASE is NAME:TOPIC:PROPERTIES, PROPERTIES a file of client settings
// (security.protocol, sasl.jaas.config, ...). With a TOPIC, COUNT records are produced to
// its partition 0 (acks=all) and read back from offset 0: prints "NAME received V0,V1,...".
// With TOPIC "-" the client is expected to be refused: an Admin asks for the cluster's
// nodes and prints "NAME refused MILLIS EXCEPTION MESSAGE" (the exception the client
// raised, its class's simple name), or "NAME answered" if it was not refused.
// Usage: java -cp 'JARS/*' SecuredClients.java BOOTSTRAP COUNT CASE...

import java.io.FileInputStream;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class SecuredClients {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        int count = Integer.parseInt(args[1]);
        for (int i = 2; i < args.length; i++) {
            String[] parts = args[i].split(":", 3);
            Properties settings = new Properties();
            try (FileInputStream in = new FileInputStream(parts[2])) {
                settings.load(in);
            }
            settings.put("bootstrap.servers", bootstrap);
            String result = parts[1].equals("-")
                ? refusal(settings)
                : "received " + String.join(",", roundTrip(settings, parts[1], count));
            System.out.println(parts[0] + " " + result);
        }
    }

    static List<String> roundTrip(Properties settings, String topic, int count) throws Exception {
        Properties produce = new Properties();
        produce.putAll(settings);
        produce.put("acks", "all");
        produce.put("key.serializer", StringSerializer.class.getName());
        produce.put("value.serializer", StringSerializer.class.getName());
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(produce)) {
            var sends = new ArrayList<java.util.concurrent.Future<?>>();
            for (int i = 0; i < count; i++) {
                sends.add(producer.send(new ProducerRecord<>(topic, 0, null, "v" + i)));
            }
            for (var send : sends) {
                send.get();
            }
        }
        Properties consume = new Properties();
        consume.putAll(settings);
        consume.put("key.deserializer", StringDeserializer.class.getName());
        consume.put("value.deserializer", StringDeserializer.class.getName());
        List<String> values = new ArrayList<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(consume)) {
            TopicPartition partition = new TopicPartition(topic, 0);
            consumer.assign(List.of(partition));
            consumer.seek(partition, 0);
            long deadline = System.currentTimeMillis() + 60_000;
            while (values.size() < count && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(500))) {
                    values.add(record.value());
                }
            }
        }
        return values;
    }

    static String refusal(Properties settings) throws InterruptedException {
        long start = System.nanoTime();
        try (Admin admin = Admin.create(settings)) {
            admin.describeCluster().nodes().get();
            return "answered";
        } catch (ExecutionException e) {
            long millis = (System.nanoTime() - start) / 1_000_000;
            Throwable cause = e.getCause();
            String message = String.valueOf(cause.getMessage()).replace('\n', ' ');
            return "refused " + millis + " " + cause.getClass().getSimpleName() + " " + message;
        }
    }
}
