// Fetching from the closest replica (KIP-392) with Kafka's Java client: creates TOPIC (one
// partition on three brokers), sends COUNT 1 KiB records (acks=all), then reads them all
// twice: once with client.rack set to a follower's rack, once with no rack. The node that
// served each read is the one the consumer received the most bytes from (its per-node
// metric incoming-byte-total). Prints one "name value" line per result for the test.
// Usage: java -cp 'JARS/*' RackFetch.java BOOTSTRAP TOPIC COUNT

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class RackFetch {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1];
        int count = Integer.parseInt(args[2]);
        TopicPartitionInfo partition;
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
            admin.createTopics(List.of(new NewTopic(topic, 1, (short) 3))).all().get();
            long deadline = System.currentTimeMillis() + 30_000;
            partition = null;
            while (partition == null || partition.leader() == null || partition.isr().size() < 3) {
                if (System.currentTimeMillis() > deadline) throw new AssertionError("ISR not full");
                try {
                    TopicDescription description =
                        admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
                    partition = description.partitions().get(0);
                } catch (ExecutionException e) {
                    // A broker may learn of the new topic after the one that created it.
                    if (!(e.getCause() instanceof UnknownTopicOrPartitionException)) throw e;
                }
            }
        }
        Properties produce = new Properties();
        produce.put("bootstrap.servers", bootstrap);
        produce.put("acks", "all");
        produce.put("key.serializer", ByteArraySerializer.class.getName());
        produce.put("value.serializer", ByteArraySerializer.class.getName());
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(produce)) {
            List<Future<?>> sends = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                sends.add(producer.send(new ProducerRecord<>(topic, new byte[1024])));
            }
            for (Future<?> send : sends) send.get();
        }
        Node leader = partition.leader();
        Node follower = partition.replicas().stream()
            .filter(n -> n.id() != leader.id()).findFirst().orElseThrow();
        System.out.println("leader_rack_differs " + !leader.rack().equals(follower.rack()));

        Node inRack = read(bootstrap, topic, count, follower.rack(), partition);
        System.out.println("with_rack_received " + count);
        System.out.println("with_rack_served_by_leader " + (inRack.id() == leader.id()));
        System.out.println("with_rack_served_in_client_rack " + follower.rack().equals(inRack.rack()));
        Node noRack = read(bootstrap, topic, count, null, partition);
        System.out.println("no_rack_served_by_leader " + (noRack.id() == leader.id()));
    }

    /** Reads every record with client.rack `rack`; returns the node that sent the most. */
    static Node read(String bootstrap, String topic, int count, String rack, TopicPartitionInfo partition) {
        Properties consume = new Properties();
        consume.put("bootstrap.servers", bootstrap);
        if (rack != null) consume.put("client.rack", rack);
        consume.put("auto.offset.reset", "earliest");
        consume.put("key.deserializer", ByteArrayDeserializer.class.getName());
        consume.put("value.deserializer", ByteArrayDeserializer.class.getName());
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consume)) {
            consumer.assign(List.of(new TopicPartition(topic, 0)));
            long received = 0, deadline = System.currentTimeMillis() + 60_000;
            while (received < count) {
                if (System.currentTimeMillis() > deadline) throw new AssertionError("read " + received);
                received += consumer.poll(Duration.ofMillis(200)).count();
            }
            Node busiest = null;
            double most = -1;
            for (Node node : partition.replicas()) {
                double bytes = incoming(consumer.metrics(), "node-" + node.id());
                if (bytes > most) {
                    most = bytes;
                    busiest = node;
                }
            }
            return busiest;
        }
    }

    static double incoming(Map<MetricName, ? extends Metric> metrics, String nodeId) {
        for (Map.Entry<MetricName, ? extends Metric> entry : metrics.entrySet()) {
            MetricName name = entry.getKey();
            if (name.group().equals("consumer-node-metrics")
                    && name.name().equals("incoming-byte-total")
                    && nodeId.equals(name.tags().get("node-id"))) {
                return (double) entry.getValue().metricValue();
            }
        }
        return 0;
    }
}
