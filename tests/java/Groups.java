// Two consumers of Kafka's Java client in one group, for each partition.assignment.strategy
// in STRATEGIES ("range", "cooperative-sticky"): both join, then the idempotent producer
// (acks=all) sends COUNT records to TOPIC-STRATEGY (PARTITIONS partitions, replication
// factor RF), which the two read between them, committing what they read on revocation and
// at the end; then the Admin API describes the group, alters and deletes its offsets and
// deletes it. Prints one "STRATEGY_name value" line per result for the test.
// Usage: java -cp 'JARS/*' Groups.java BOOTSTRAP TOPIC PARTITIONS RF COUNT STRATEGIES

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.RangeAssignor;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class Groups {
    public static void main(String[] args) throws Exception {
        for (String strategy : args[5].split(",")) {
            String topic = args[1] + "-" + strategy;
            run(args[0], topic, Integer.parseInt(args[2]), Short.parseShort(args[3]),
                Integer.parseInt(args[4]), topic + "-group", strategy);
        }
    }

    static void run(String bootstrap, String topic, int partitions, short replicas, int count,
            String groupId, String strategy) throws Exception {
        String name = strategy.replace("-", "_") + "_";
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
            admin.createTopics(List.of(new NewTopic(topic, partitions, replicas))).all().get();
        }
        String assignor = strategy.equals("range")
            ? RangeAssignor.class.getName() : CooperativeStickyAssignor.class.getName();
        List<KafkaConsumer<String, String>> consumers = new ArrayList<>();
        for (int i = 0; i < 2; i++) {
            Properties consume = new Properties();
            consume.put("bootstrap.servers", bootstrap);
            consume.put("group.id", groupId);
            consume.put("client.id", groupId + "-" + i);
            consume.put("partition.assignment.strategy", assignor);
            // A member learns of a rebalance by its heartbeat: soon, so that the test is short.
            consume.put("heartbeat.interval.ms", "200");
            consume.put("auto.offset.reset", "earliest");
            consume.put("enable.auto.commit", "false");
            consume.put("key.deserializer", StringDeserializer.class.getName());
            consume.put("value.deserializer", StringDeserializer.class.getName());
            consumers.add(new KafkaConsumer<>(consume));
        }
        Set<String> values = new HashSet<>();
        long[] received = {0};
        for (KafkaConsumer<String, String> consumer : consumers) {
            consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                public void onPartitionsRevoked(Collection<TopicPartition> revoked) {
                    // What was read is committed before another member may take it over.
                    consumer.commitSync();
                }
                public void onPartitionsAssigned(Collection<TopicPartition> assigned) {}
            });
        }
        long deadline = System.currentTimeMillis() + 60_000;
        // Both members join before the records exist, so the group is stable when they come.
        while (consumers.stream().anyMatch(c -> c.assignment().isEmpty())) {
            if (System.currentTimeMillis() > deadline) throw new AssertionError("no assignment");
            for (KafkaConsumer<String, String> consumer : consumers) {
                poll(consumer, values, received);
            }
        }
        Properties produce = new Properties();
        produce.put("bootstrap.servers", bootstrap);
        produce.put("enable.idempotence", "true");
        produce.put("acks", "all");
        produce.put("key.serializer", StringSerializer.class.getName());
        produce.put("value.serializer", StringSerializer.class.getName());
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(produce)) {
            List<Future<?>> sends = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                sends.add(producer.send(new ProducerRecord<>(topic, "k" + i, "v" + i)));
            }
            for (Future<?> send : sends) send.get();
            System.out.println(name + "acked " + sends.size());
        }
        while (received[0] < count && System.currentTimeMillis() < deadline) {
            for (KafkaConsumer<String, String> consumer : consumers) {
                poll(consumer, values, received);
            }
        }
        int assigned = 0;
        Set<TopicPartition> all = new HashSet<>();
        for (int i = 0; i < consumers.size(); i++) {
            KafkaConsumer<String, String> consumer = consumers.get(i);
            consumer.commitSync();
            System.out.println(name + "member_" + i + "_has_partitions " + !consumer.assignment().isEmpty());
            assigned += consumer.assignment().size();
            all.addAll(consumer.assignment());
        }
        long committed = 0;
        for (OffsetAndMetadata offset : consumers.get(0).committed(all).values()) {
            committed += offset == null ? 0 : offset.offset();
        }
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
            var group = admin.describeConsumerGroups(List.of(groupId)).all().get().get(groupId);
            System.out.println(name + "describe_state " + group.groupState());
            System.out.println(name + "describe_members " + group.members().size());
            System.out.println(name + "describe_assignor " + group.partitionAssignor());
            System.out.println(name + "delete_active " + error(admin.deleteConsumerGroups(List.of(groupId)).all()));
            for (KafkaConsumer<String, String> consumer : consumers) consumer.close();
            group = admin.describeConsumerGroups(List.of(groupId)).all().get().get(groupId);
            System.out.println(name + "closed_state " + group.groupState());
            TopicPartition first = new TopicPartition(topic, 0);
            admin.alterConsumerGroupOffsets(groupId, Map.of(first, new OffsetAndMetadata(1))).all().get();
            long reset = admin.listConsumerGroupOffsets(groupId).partitionsToOffsetAndMetadata().get().get(first).offset();
            System.out.println(name + "altered_offset " + reset);
            System.out.println(name + "delete_offsets " + error(admin.deleteConsumerGroupOffsets(groupId, Set.of(first)).all()));
            System.out.println(name + "offsets_after_delete " + admin.listConsumerGroupOffsets(groupId).partitionsToOffsetAndMetadata().get().size());
            System.out.println(name + "delete_empty " + error(admin.deleteConsumerGroups(List.of(groupId)).all()));
            System.out.println(name + "listed_after_delete " + admin.listGroups().all().get().stream().anyMatch(g -> g.groupId().equals(groupId)));
            System.out.println(name + "describe_deleted " + error(admin.describeConsumerGroups(List.of(groupId)).all()));
        }
        System.out.println(name + "assigned " + assigned);
        System.out.println(name + "distinct_assigned " + all.size());
        System.out.println(name + "received " + received[0]);
        System.out.println(name + "distinct " + values.size());
        System.out.println(name + "committed " + committed);
    }

    /** "ok" if the call succeeds, else its exception's simple class name. */
    static String error(KafkaFuture<?> future) throws InterruptedException {
        try {
            future.get();
            return "ok";
        } catch (ExecutionException e) {
            return e.getCause().getClass().getSimpleName();
        }
    }

    static void poll(KafkaConsumer<String, String> consumer, Set<String> values, long[] received) {
        for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(100))) {
            received[0]++;
            values.add(record.key() + "=" + record.value());
        }
    }
}
