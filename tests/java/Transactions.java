// Kafka's Java client's transactions end to end: a committed transaction, an aborted one,
// one that sends a group's offsets, then a second producer with the same transactional id
// fencing the first. Prints one "name value" line per result for the test, among them
// the producer epochs the broker reports (transactions v2 bump the epoch per transaction).
// Usage: java -cp 'JARS/*' Transactions.java BOOTSTRAP TOPIC TRANSACTIONAL_ID GROUP REPLICAS

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionState;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class Transactions {
    static String bootstrap, topic, transactionalId, group;

    public static void main(String[] args) throws Exception {
        bootstrap = args[0];
        topic = args[1];
        transactionalId = args[2];
        group = args[3];
        short replicas = Short.parseShort(args[4]);
        TopicPartition partition = new TopicPartition(topic, 0);
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
            admin.createTopics(List.of(new NewTopic(topic, 1, replicas))).all().get();

            KafkaProducer<String, String> first = producer();
            first.initTransactions();
            first.beginTransaction();
            for (int i = 0; i < 5; i++) first.send(new ProducerRecord<>(topic, "c" + i));
            first.commitTransaction();
            first.beginTransaction();
            for (int i = 0; i < 5; i++) first.send(new ProducerRecord<>(topic, "a" + i));
            first.flush();
            first.abortTransaction();
            first.beginTransaction();
            first.send(new ProducerRecord<>(topic, "c5"));
            first.sendOffsetsToTransaction(
                    Map.of(partition, new OffsetAndMetadata(7)), new ConsumerGroupMetadata(group));
            first.commitTransaction();
            System.out.println("epoch_after_three " + describe(admin).producerEpoch());

            KafkaProducer<String, String> second = producer();
            second.initTransactions();
            System.out.println("fenced_at_send " + outcome(() -> {
                first.beginTransaction();
                first.send(new ProducerRecord<>(topic, "zombie")).get();
            }));
            System.out.println("fenced_at_commit " + outcome(first::commitTransaction));
            first.close(Duration.ZERO);
            second.beginTransaction();
            second.send(new ProducerRecord<>(topic, "c6"));
            second.commitTransaction();
            second.close();
            TransactionDescription last = describe(admin);
            System.out.println("state " + last.state());
            System.out.println("epoch_after_fencing_and_one_more " + last.producerEpoch());
            System.out.println("committed_offset "
                    + admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get()
                            .get(partition).offset());
        }
        System.out.println("read_committed " + String.join(",", read("read_committed")));
        System.out.println("read_uncommitted " + String.join(",", read("read_uncommitted")));
    }

    static KafkaProducer<String, String> producer() {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("transactional.id", transactionalId);
        p.put("key.serializer", StringSerializer.class.getName());
        p.put("value.serializer", StringSerializer.class.getName());
        return new KafkaProducer<>(p);
    }

    /** The transaction's description once its markers are written (EndTxn answers before). */
    static TransactionDescription describe(Admin admin) throws Exception {
        long deadline = System.currentTimeMillis() + 30_000;
        while (true) {
            TransactionDescription d =
                    admin.describeTransactions(List.of(transactionalId)).description(transactionalId).get();
            boolean prepared = d.state() == TransactionState.PREPARE_COMMIT
                    || d.state() == TransactionState.PREPARE_ABORT;
            if (!prepared || System.currentTimeMillis() > deadline) return d;
            Thread.sleep(20);
        }
    }

    interface Step {
        void run() throws Exception;
    }

    /** "ok", or the simple name of what the step threw (its cause's, if wrapped). */
    static String outcome(Step step) {
        try {
            step.run();
            return "ok";
        } catch (Exception e) {
            Throwable t = e instanceof java.util.concurrent.ExecutionException ? e.getCause() : e;
            return t.getClass().getSimpleName();
        }
    }

    static List<String> read(String isolation) {
        Properties c = new Properties();
        c.put("bootstrap.servers", bootstrap);
        c.put("isolation.level", isolation);
        c.put("key.deserializer", StringDeserializer.class.getName());
        c.put("value.deserializer", StringDeserializer.class.getName());
        List<String> values = new ArrayList<>();
        TopicPartition partition = new TopicPartition(topic, 0);
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(c)) {
            consumer.assign(List.of(partition));
            consumer.seekToBeginning(List.of(partition));
            long end = consumer.endOffsets(List.of(partition)).get(partition);
            long deadline = System.currentTimeMillis() + 30_000;
            while (consumer.position(partition) < end && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                    values.add(r.value());
                }
            }
        }
        return values;
    }
}
