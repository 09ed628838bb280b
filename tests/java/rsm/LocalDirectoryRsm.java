import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.channels.Channels;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.Map;
import java.util.Optional;

import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;

/**
 * A RemoteStorageManager for Apache Kafka that keeps each copied segment and its indexes as
 * files in a local directory (`rsm.config.dir`): the same kind of remote tier as tierbroker's
 * local-directory one, so tiering can be compared on one machine. Kafka's own test RSM is not
 * published on Maven Central.
 */
public class LocalDirectoryRsm implements RemoteStorageManager {
    private Path root;

    @Override
    public void configure(Map<String, ?> configs) {
        root = Path.of((String) configs.get("dir"));
        try {
            Files.createDirectories(root);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** The files of one segment share a name: its partition's folder, start offset and id. */
    private Path file(RemoteLogSegmentMetadata segment, String suffix) {
        var id = segment.remoteLogSegmentId();
        var partition = id.topicIdPartition().topicPartition().toString();
        return root.resolve(partition).resolve(segment.startOffset() + "-" + id.id() + suffix);
    }

    @Override
    public Optional<RemoteLogSegmentMetadata.CustomMetadata> copyLogSegmentData(
            RemoteLogSegmentMetadata segment, LogSegmentData data) throws RemoteStorageException {
        try {
            Files.createDirectories(file(segment, "").getParent());
            copy(data.offsetIndex(), file(segment, ".index"));
            copy(data.timeIndex(), file(segment, ".timeindex"));
            copy(data.producerSnapshotIndex(), file(segment, ".snapshot"));
            if (data.transactionIndex().isPresent()) {
                copy(data.transactionIndex().get(), file(segment, ".txnindex"));
            }
            var epochIndex = data.leaderEpochIndex().duplicate();
            var bytes = new byte[epochIndex.remaining()];
            epochIndex.get(bytes);
            var epochs = file(segment, ".leader-epoch-checkpoint");
            publish(Files.write(partial(epochs), bytes), epochs);
            // The log file last: a segment whose log is present is complete.
            copy(data.logSegment(), file(segment, ".log"));
        } catch (IOException e) {
            throw new RemoteStorageException(e);
        }
        return Optional.empty();
    }

    private static void copy(Path from, Path to) throws IOException {
        Files.copy(from, partial(to), StandardCopyOption.REPLACE_EXISTING);
        publish(partial(to), to);
    }

    private static Path partial(Path path) {
        return path.resolveSibling(path.getFileName() + ".partial");
    }

    /** Each file is written under a temporary name, synced, then renamed, as tierbroker's
     * tier writes its objects. */
    private static void publish(Path partial, Path to) throws IOException {
        try (var channel = FileChannel.open(partial, StandardOpenOption.WRITE)) {
            channel.force(true);
        }
        Files.move(partial, to, StandardCopyOption.ATOMIC_MOVE);
    }

    @Override
    public InputStream fetchLogSegment(RemoteLogSegmentMetadata segment, int startPosition)
            throws RemoteStorageException {
        return fetchLogSegment(segment, startPosition, Integer.MAX_VALUE - 1);
    }

    @Override
    public InputStream fetchLogSegment(RemoteLogSegmentMetadata segment, int startPosition,
            int endPosition) throws RemoteStorageException {
        try {
            var channel = FileChannel.open(existing(file(segment, ".log")));
            long end = Math.min(channel.size(), (long) endPosition + 1);
            channel.position(startPosition);
            var stream = Channels.newInputStream(channel);
            return new InputStream() {
                private long left = Math.max(0, end - startPosition);

                @Override
                public int read() throws IOException {
                    if (left <= 0) return -1;
                    left--;
                    return stream.read();
                }

                @Override
                public int read(byte[] buffer, int offset, int length) throws IOException {
                    if (left <= 0) return -1;
                    int read = stream.read(buffer, offset, (int) Math.min(length, left));
                    if (read > 0) left -= read;
                    return read;
                }

                @Override
                public void close() throws IOException {
                    stream.close();
                }
            };
        } catch (IOException e) {
            throw new RemoteStorageException(e);
        }
    }

    @Override
    public InputStream fetchIndex(RemoteLogSegmentMetadata segment, IndexType type)
            throws RemoteStorageException {
        String suffix = switch (type) {
            case OFFSET -> ".index";
            case TIMESTAMP -> ".timeindex";
            case PRODUCER_SNAPSHOT -> ".snapshot";
            case TRANSACTION -> ".txnindex";
            case LEADER_EPOCH -> ".leader-epoch-checkpoint";
        };
        try {
            return Files.newInputStream(existing(file(segment, suffix)));
        } catch (IOException e) {
            throw new RemoteStorageException(e);
        }
    }

    private static Path existing(Path path) throws RemoteResourceNotFoundException {
        if (!Files.exists(path)) {
            throw new RemoteResourceNotFoundException("no " + path);
        }
        return path;
    }

    @Override
    public void deleteLogSegmentData(RemoteLogSegmentMetadata segment) throws RemoteStorageException {
        try {
            for (var suffix : new String[] {".log", ".index", ".timeindex", ".snapshot", ".txnindex",
                    ".leader-epoch-checkpoint"}) {
                Files.deleteIfExists(file(segment, suffix));
            }
        } catch (IOException e) {
            throw new RemoteStorageException(e);
        }
    }

    @Override
    public void close() {}
}
